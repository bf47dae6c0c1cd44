"""Parallel text for translation: Multi30k's raw files, a user's own parallel files or TSV, or a hub dataset
(WMT14, WMT16, IWSLT2017) through HF `datasets`.

Sentences are tokenized once with an HF `tokenizers` BPE model trained on the training split (one joint
vocabulary, or one per language) and stored as flat memory-mapped token arrays under the cache directory, keyed by
the data and the settings: the next run loads them. Training batches hold sentences of similar length (bucketing),
by a sentence count or a token budget, so padding stays small. Each batch is a dict:
    src (B, S), tgt (B, T) = [BOS] ... [EOS], padded with pad_id; ref: the target sentences as text (for BLEU);
    src_text: the source sentences as text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from attnlab.compat import keep_own_batch_sampler
from attnlab.data.base import BaseDataModule
from attnlab.data.cache import cache_key, file_identity
from attnlab.data.info import DataInfo
from attnlab.data.translation.parallel_sets import (BucketBatchSampler, PadCollator, ParallelSet, RaggedArray,
                                                   write_ragged)
from attnlab.data.translation.parallel_text import clean_text, hub_pairs, multi30k_files, read_pair, read_tsv
from attnlab.data.text.tokenizers import PAD, UNK, TextTokenizer, build_tokenizer, tokenizer_from_json
from attnlab.errors import UserError
from attnlab.types import Encoding, PositiveInt

log = logging.getLogger("attnlab")

BOS, EOS = "[BOS]", "[EOS]"
SPECIALS = [PAD, UNK, BOS, EOS]  # ids 0..3 in every vocabulary
MULTI30K_LANGS = ("en", "de", "fr", "cs")


# ---- the DataModule

class TranslationDataModule(BaseDataModule):
    """Sentence pairs from `source`: multi30k (raw files in <data_dir>/multi30k), files (data.train / val / test:
    each [src_file, tgt_file] or one .tsv), or hub (data.hub: {path, name, val_split, test_split}).

    Args:
        src_lang / tgt_lang: the direction (Multi30k: en, de, fr, cs; hub: the keys of the translation records).
        joint_vocab: one BPE vocabulary for both languages (needed for shared embeddings), or one per language.
        vocab_size, min_frequency: tokenizer settings.
        lowercase, normalize (a Unicode normal form such as NFKC): applied to all text, the BLEU references too.
        max_length: longest sequence in tokens, [BOS]/[EOS] included; longer sentences are truncated (warned).
        max_tokens: a token budget per training batch (padded), instead of a fixed batch_size.
    """

    def __init__(self, kind: str = "parallel", name: str = "parallel", source: str = "files",
                 src_lang: str = "de", tgt_lang: str = "en", data_dir: str = "data",
                 train: Any = None, val: Any = None, test: Any = None, hub: dict | None = None,
                 download: bool = True, joint_vocab: bool = True, vocab_size: PositiveInt = 8000,
                 min_frequency: PositiveInt = 2, lowercase: bool = False,
                 normalize: Literal["NFC", "NFD", "NFKC", "NFKD"] | None = None, max_length: PositiveInt = 128,
                 max_tokens: PositiveInt | None = None, encoding: Encoding = "utf-8",
                 cache_dir: str = ".cache", src_vocab_size: int | None = None, tgt_vocab_size: int | None = None,
                 pad_id: int | None = None, bos_id: int | None = None, eos_id: int | None = None,
                 **base: Any):
        super().__init__(kind=kind, **base)
        self.encoding = encoding
        if src_lang == tgt_lang:
            raise UserError(f"data.src_lang and data.tgt_lang are both '{src_lang}': translation needs two "
                            "languages, e.g. data.src_lang=de data.tgt_lang=en.")
        if source == "multi30k":
            for lang in (src_lang, tgt_lang):
                if lang not in MULTI30K_LANGS:
                    raise UserError(f"'{lang}' is not a Multi30k language: Multi30k task 1 has "
                                    f"{', '.join(MULTI30K_LANGS)} (data.src_lang / data.tgt_lang).")
        if source not in ("multi30k", "files", "hub"):
            raise UserError(f"data.source={source}: use multi30k, files or hub.")
        self.name, self.source, self.src_lang, self.tgt_lang = name, source, src_lang, tgt_lang
        self.data_dir, self.cache_dir = Path(data_dir), Path(cache_dir)
        self.files = {"train": train, "val": val, "test": test}
        # files without data.test: the test split is the validation files, said with the results
        self.test_is_validation = source not in ("multi30k", "hub") and not test and bool(val)
        self.hub, self.download = hub, download
        self.joint_vocab, self.vocab_size, self.min_frequency = joint_vocab, int(vocab_size), int(min_frequency)
        if normalize and normalize not in ("NFC", "NFKC", "NFD", "NFKD"):
            raise UserError(f"data.normalize={normalize}: use a Unicode normal form (NFC, NFKC, NFD, NFKD) or null.")
        self.lowercase, self.normalize = lowercase, normalize
        self.max_length, self.max_tokens = int(max_length), max_tokens
        self.tokenizers: tuple[TextTokenizer, TextTokenizer] | None = None
        self.texts: dict[str, tuple[list[str], list[str]]] = {}

    # ---- what the model reads
    def info(self) -> DataInfo:
        if self.tokenizers is None:
            return DataInfo(self.kind)
        src, tgt = self.tokenizers
        return DataInfo(self.kind, src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size,
                        pad_id=src.token_to_id(PAD), bos_id=tgt.token_to_id(BOS), eos_id=tgt.token_to_id(EOS),
                        max_length=self.max_length, src_tokenizer=src.to_json(), tgt_tokenizer=tgt.to_json())

    # ---- reading
    def _hint(self) -> str:
        if self.source == "multi30k":
            return (f"Multi30k's raw files (train / val / test_2016_flickr .{self.src_lang}.gz and "
                    f".{self.tgt_lang}.gz) go in {self.data_dir / 'multi30k'}; get them from "
                    "https://github.com/multi30k/dataset (data/task1/raw), or go online with data.download=true.")
        return ("Point data.train / data.val / data.test at [source_file, target_file] pairs (one sentence per "
                "line, line-aligned, .txt or .gz) or at one .tsv file each (source<TAB>target).")

    def _read(self, split: str) -> tuple[list[str], list[str]]:
        if self.source == "multi30k":
            paths = [multi30k_files(self.data_dir, split, lang, self.download)
                     for lang in (self.src_lang, self.tgt_lang)]
            src, tgt = read_pair(*paths, self._hint())
        elif self.source == "hub":
            hub = dict(self.hub or {})
            split_name = (hub.pop(f"{split}_split", None)
                          or {"train": "train", "val": "validation", "test": "test"}[split])
            src, tgt = hub_pairs(hub, split_name, self.src_lang, self.tgt_lang, self.cache_dir)
        else:
            spec = self.files[split]
            if not spec:
                if split == "train":
                    raise UserError("data=parallel needs data.train=[source_file,target_file] (or a .tsv file). "
                                    + self._hint())
                spec = self.files["val"] if split == "test" and self.files["val"] else None
                if not spec:
                    raise UserError(f"data.{split} is not set: name the {split} files. " + self._hint())
            if isinstance(spec, str):
                src, tgt = read_tsv(Path(spec).expanduser(), self._hint(), self.encoding)
            elif len(spec) == 2:
                src, tgt = read_pair(Path(spec[0]).expanduser(), Path(spec[1]).expanduser(), self._hint(),
                                     self.encoding)
            else:
                raise UserError(f"data.{split}={spec}: give [source_file, target_file] or one .tsv file.")
        return [clean_text(t, self.lowercase, self.normalize) for t in src], \
            [clean_text(t, self.lowercase, self.normalize) for t in tgt]

    def _identity(self, split: str) -> Any:
        if self.source == "multi30k":
            return [file_identity(multi30k_files(self.data_dir, split, lang, False))
                    for lang in (self.src_lang, self.tgt_lang)]
        if self.source == "hub":
            return {"hub": self.hub, "split": split}
        spec = self.files[split] or self.files["val"]
        return [file_identity(Path(p).expanduser()) for p in ([spec] if isinstance(spec, str) else spec)]

    # ---- preparing (tokenizers, token arrays), once per corpus + settings
    def prepare_data(self) -> None:
        self._prepare()

    def _prepare(self) -> None:
        if self.tokenizers is not None:
            return
        self.texts = {split: self._read(split) for split in ("train", "val", "test")}
        train_src, train_tgt = self.texts["train"]
        corpus = {"source": self.source, "train": self._identity("train"), "langs": [self.src_lang, self.tgt_lang],
                  "lowercase": self.lowercase, "normalize": self.normalize}
        if self.encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
            corpus["encoding"] = self.encoding  # the text read, so the vocabulary and token cache, depend on it
        settings = dict(cache_dir=self.cache_dir, vocab_size=self.vocab_size, specials=SPECIALS,
                        min_frequency=self.min_frequency, lowercase=self.lowercase, unicode_form=self.normalize)
        if self.joint_vocab:
            tok, _ = build_tokenizer("bpe", cache_key(corpus | {"side": "joint"}), lambda: iter(train_src + train_tgt),
                                     None, **settings)
            self.tokenizers = (tok, tok)
        else:
            self.tokenizers = tuple(
                build_tokenizer("bpe", cache_key(corpus | {"side": side}), lambda t=texts: iter(t), None, **settings)[0]
                for side, texts in (("src", train_src), ("tgt", train_tgt))
            )
        self.arrays = {split: self._tokenized(split, corpus) for split in ("train", "val", "test")}

    def _tokenized(self, split: str, corpus: dict) -> tuple[RaggedArray, RaggedArray]:
        src_tok, tgt_tok = self.tokenizers
        key = cache_key(corpus | {"split": split, "identity": self._identity(split), "max_length": self.max_length,
                                  "vocab": [src_tok.to_json(), tgt_tok.to_json()]})
        out = self.cache_dir / "translation" / f"{self.name}-{split}-{key}"
        bos, eos = tgt_tok.token_to_id(BOS), tgt_tok.token_to_id(EOS)
        dtype = np.uint16 if max(src_tok.vocab_size, tgt_tok.vocab_size) < 2**16 else np.int32
        if not (out / "tgt" / "offsets.npy").is_file():
            src_text, tgt_text = self.texts[split]
            truncated = 0

            def encoded(tok: TextTokenizer, texts: list[str], with_bos: bool) -> Iterator[list[int]]:
                nonlocal truncated
                for i in range(0, len(texts), 10_000):
                    for ids in tok.encode_batch(texts[i : i + 10_000]):
                        ids = [bos, *ids, eos] if with_bos else [*ids, eos]
                        if len(ids) > self.max_length:
                            truncated += 1
                            ids = ids[: self.max_length - 1] + [eos]
                        yield ids

            log.info("translation: tokenizing the %s split (%d pairs) into %s", split, len(src_text), out)
            write_ragged(encoded(src_tok, src_text, False), out / "src", dtype)
            write_ragged(encoded(tgt_tok, tgt_text, True), out / "tgt", dtype)
            if truncated:
                log.warning("%s split: %d sentence(s) longer than data.max_length=%d tokens were truncated; raise "
                            "data.max_length (and model.max_len) to keep them whole.", split, truncated,
                            self.max_length)
        return RaggedArray(out / "src" / "flat.npy", out / "src" / "offsets.npy"), \
            RaggedArray(out / "tgt" / "flat.npy", out / "tgt" / "offsets.npy")

    def build_splits(self):
        self._prepare()
        sets = []
        for split in ("train", "val", "test"):
            src, tgt = self.arrays[split]
            texts = self.texts[split] if split != "train" else (None, None)
            sets.append(ParallelSet(src, tgt, *texts))
        return tuple(sets)

    # ---- loaders
    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.trainer is not None:  # the batch samplers shard by rank themselves: Lightning must not re-wrap them
            keep_own_batch_sampler(self.trainer)

    def batch_sampler(self, ds: ParallelSet, train: bool, world: int, rank: int) -> BucketBatchSampler:
        return BucketBatchSampler(ds.lengths(), self.batch_size if train else self.eval_batch_size,
                                  self.max_tokens if train else None, shuffle=train, seed=self.seed,
                                  num_replicas=world, rank=rank)

    def collate_fn(self, train: bool) -> PadCollator:
        return PadCollator(self.tokenizers[0].token_to_id(PAD))


def tokenizer_pair(src_json: str, tgt_json: str) -> tuple[TextTokenizer, TextTokenizer]:
    src = tokenizer_from_json(src_json)
    return src, (src if tgt_json == src_json else tokenizer_from_json(tgt_json))
