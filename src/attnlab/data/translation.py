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

import gzip
import unicodedata
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from attnlab.compat import keep_own_batch_sampler
from attnlab.data.base import BaseDataModule
from attnlab.data.cache import cache_key, file_identity
from attnlab.data.samplers import ResumableDataLoader
from attnlab.data.tokenizers import PAD, UNK, TextTokenizer, build_tokenizer, tokenizer_from_json
from attnlab.errors import UserError

log = logging.getLogger("attnlab")

BOS, EOS = "[BOS]", "[EOS]"
SPECIALS = [PAD, UNK, BOS, EOS]  # ids 0..3 in every vocabulary
MULTI30K_LANGS = ("en", "de", "fr", "cs")
MULTI30K_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"


# ---- reading sentence pairs

def clean_text(text: str, lowercase: bool = False, normalize: str | None = None) -> str:
    text = unicodedata.normalize(normalize, text) if normalize else text
    return text.lower() if lowercase else text


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): convert it, e.g. "
                        f"`iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`.") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise UserError(f"{path} is not a complete gzip file ({e}): download it again, or give it uncompressed "
                        "without the .gz suffix.") from None


def _check_exists(path: Path, hint: str) -> None:
    if not path.is_file():
        raise UserError(f"parallel text file {path} does not exist. {hint}")


def read_pair(src_path: Path, tgt_path: Path, hint: str) -> tuple[list[str], list[str]]:
    """The sentences of two line-aligned files; empty pairs are left out (with a warning)."""
    for p in (src_path, tgt_path):
        _check_exists(p, hint)
    src, tgt = _read_lines(src_path), _read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(
            f"{src_path} has {len(src):,} lines but {tgt_path} has {len(tgt):,}: line i of one must be the "
            "translation of line i of the other. Check that both files are complete and of the same split."
        )
    return drop_empty(src, tgt, f"{src_path} / {tgt_path}")


def read_tsv(path: Path, hint: str) -> tuple[list[str], list[str]]:
    _check_exists(path, hint)
    src, tgt = [], []
    for n, line in enumerate(_read_lines(path), 1):
        cols = line.split("\t")
        if len(cols) < 2 and line.strip():
            raise UserError(f"{path}, line {n}: a TSV line needs the source and the target separated by a tab "
                            f"(found {len(cols)} column). Fix the line or remove it.")
        src.append(cols[0] if cols else "")
        tgt.append(cols[1] if len(cols) > 1 else "")
    return drop_empty(src, tgt, str(path))


def drop_empty(src: list[str], tgt: list[str], where: str) -> tuple[list[str], list[str]]:
    keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s.strip() and t.strip()]
    if len(keep) < len(src):
        kept = set(keep)
        empty = [i + 1 for i in range(len(src)) if i not in kept]
        log.warning("%s: %d pair(s) with an empty side left out (lines %s%s)", where, len(empty),
                    ", ".join(map(str, empty[:10])), ", ..." if len(empty) > 10 else "")
    if not keep:
        raise UserError(f"{where}: every line pair has an empty side; there is nothing to translate.")
    return [src[i].strip() for i in keep], [tgt[i].strip() for i in keep]


def multi30k_files(data_dir: Path, split: str, lang: str, download: bool) -> Path:
    name = MULTI30K_SPLITS[split]
    path = data_dir / "multi30k" / f"{name}.{lang}.gz"
    if path.is_file() or not download:
        return path
    url = MULTI30K_URL.format(name=name, lang=lang)
    log.info("multi30k: downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            payload = r.read()
    except OSError as e:
        log.warning("multi30k: could not download %s (%s)", url, e)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(payload)
    tmp.replace(path)
    return path


def hub_pairs(hub: dict, split: str, src_lang: str, tgt_lang: str, cache_dir: Path) -> tuple[list[str], list[str]]:
    """Pairs of a hub dataset whose records hold {"translation": {lang: text, ...}} (WMT, IWSLT)."""
    from attnlab.data.text import load_hub_split

    ds = load_hub_split(hub, split, cache_dir, local="translate local files with data=parallel "
                        "data.train=[train.src,train.tgt] data.val=[val.src,val.tgt]")
    src, tgt = [], []
    for record in ds:
        pair = record.get("translation") or record
        if src_lang not in pair or tgt_lang not in pair:
            raise UserError(
                f"hub dataset {hub['path']} ({hub.get('name')}) has no '{src_lang}'/'{tgt_lang}' pair: its "
                f"records hold {sorted(pair)}. Set data.src_lang / data.tgt_lang to two of them, or pick the "
                "dataset config of your language pair (data.hub.name)."
            )
        src.append(pair[src_lang])
        tgt.append(pair[tgt_lang])
    return drop_empty(src, tgt, f"hub dataset {hub['path']} ({split})")


# ---- token arrays

class RaggedArray:
    """Variable-length token sequences as one flat memory-mapped array plus offsets."""

    def __init__(self, flat_path: Path, offsets_path: Path):
        self.flat_path, self.offsets = flat_path, np.load(offsets_path)
        self._flat: np.ndarray | None = None

    @property
    def flat(self) -> np.ndarray:
        if self._flat is None:
            self._flat = np.load(self.flat_path, mmap_mode="r")
        return self._flat

    def __getstate__(self):  # DataLoader workers map the file themselves
        return {**self.__dict__, "_flat": None}

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.flat[self.offsets[i] : self.offsets[i + 1]])


def write_ragged(seqs: Iterator[list[int]], out: Path, dtype) -> None:
    flat, offsets = [], [0]
    for s in seqs:
        flat.append(np.asarray(s, dtype=dtype))
        offsets.append(offsets[-1] + len(s))
    out.mkdir(parents=True, exist_ok=True)
    for name, arr in (("flat", np.concatenate(flat) if flat else np.zeros(0, dtype)),
                      ("offsets", np.asarray(offsets, dtype=np.int64))):
        tmp = out / f"{name}.tmp.npy"
        np.save(tmp, arr)
        tmp.replace(out / f"{name}.npy")


class ParallelSet(Dataset):
    def __init__(self, src: RaggedArray, tgt: RaggedArray, src_text: list[str] | None = None,
                 tgt_text: list[str] | None = None):
        self.src, self.tgt, self.src_text, self.tgt_text = src, tgt, src_text, tgt_text

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> dict:
        item = {"src": torch.from_numpy(self.src[i].astype(np.int64)),
                "tgt": torch.from_numpy(self.tgt[i].astype(np.int64))}
        if self.tgt_text is not None:
            item["ref"], item["src_text"] = self.tgt_text[i], self.src_text[i]
        return item

    def lengths(self) -> np.ndarray:
        return np.maximum(self.src.lengths(), self.tgt.lengths())


class PadCollator:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        batch = {k: torch.nn.utils.rnn.pad_sequence([it[k] for it in items], batch_first=True,
                                                    padding_value=self.pad_id) for k in ("src", "tgt")}
        if "ref" in items[0]:
            batch["ref"] = [it["ref"] for it in items]
            batch["src_text"] = [it["src_text"] for it in items]
        return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of sentences of similar length. Each epoch: shuffle, sort by length within pools of 100 batches,
    cut into batches of `batch_size` sentences (or of at most `max_tokens` padded tokens), shuffle the batches.
    Under DDP every rank takes every world_size-th batch (training: the same count on each rank). Without shuffle
    (evaluation) the batches are in length order."""

    def __init__(self, lengths: np.ndarray, batch_size: int, max_tokens: int | None = None, shuffle: bool = True,
                 seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.lengths, self.batch_size, self.max_tokens = np.asarray(lengths), int(batch_size), max_tokens
        self.shuffle, self.seed, self.epoch = shuffle, int(seed), 0
        self.num_replicas, self.rank = num_replicas, rank
        self._resume: tuple[int, int] | None = None
        self._plan: tuple[int, list[list[int]]] | None = None
        # training: the same number of steps every epoch (a token budget cuts a varying number of batches; the
        # epoch-0 count, as Lightning reads it once, minus a margin of 1%)
        n = len(self._batches())
        self._steps = (n - (n // 100 if max_tokens else 0)) // num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, skip: int) -> None:
        """Skip the first `skip` batches of `epoch` the next time it is iterated (a run resumed mid-epoch)."""
        self._resume = (int(epoch), int(skip))

    def _batches(self) -> list[list[int]]:
        """The epoch's batches (all ranks), computed once per epoch."""
        if self._plan is not None and self._plan[0] == self.epoch:
            return self._plan[1]
        rng = np.random.default_rng(self.seed + self.epoch)
        order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        pool = len(order) if not self.shuffle else self.batch_size * 100
        batches = []
        for p in range(0, len(order), pool):
            chunk = order[p : p + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(self._cut(chunk))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        elif len(batches) < self.num_replicas <= len(order):  # every rank must evaluate something (DDP)
            size = -(-len(order) // self.num_replicas)
            batches = [order[i : i + size].tolist() for i in range(0, len(order), size)]
        self._plan = (self.epoch, batches)
        return batches

    def _cut(self, idx: np.ndarray) -> list[list[int]]:
        if not self.max_tokens:
            return [idx[i : i + self.batch_size].tolist() for i in range(0, len(idx), self.batch_size)]
        out, cur, longest = [], [], 0
        for i in idx.tolist():
            n = int(self.lengths[i])
            if cur and max(longest, n) * (len(cur) + 1) > self.max_tokens:  # the budget replaces batch_size
                out.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, n)
        return out + ([cur] if cur else [])

    def __iter__(self):
        batches = self._batches()[self.rank :: self.num_replicas]
        batches = batches[: self._steps] if self.shuffle else batches
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] == self.epoch:
            batches = batches[resume[1]:]
        yield from batches

    def __len__(self) -> int:
        if not self.shuffle:  # evaluation: every batch once, on some rank
            return len(range(self.rank, len(self._batches()), self.num_replicas))
        return self._steps


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
                 download: bool = True, joint_vocab: bool = True, vocab_size: int = 8000, min_frequency: int = 2,
                 lowercase: bool = False, normalize: str | None = None, max_length: int = 128,
                 max_tokens: int | None = None,
                 cache_dir: str = ".cache", src_vocab_size: int | None = None, tgt_vocab_size: int | None = None,
                 pad_id: int | None = None, bos_id: int | None = None, eos_id: int | None = None,
                 **base: Any):
        super().__init__(kind=kind, **base)
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
        self.hub, self.download = hub, download
        self.joint_vocab, self.vocab_size, self.min_frequency = joint_vocab, int(vocab_size), int(min_frequency)
        if normalize and normalize not in ("NFC", "NFKC", "NFD", "NFKD"):
            raise UserError(f"data.normalize={normalize}: use a Unicode normal form (NFC, NFKC, NFD, NFKD) or null.")
        self.lowercase, self.normalize = lowercase, normalize
        self.max_length, self.max_tokens = int(max_length), max_tokens
        self.tokenizers: tuple[TextTokenizer, TextTokenizer] | None = None
        self.texts: dict[str, tuple[list[str], list[str]]] = {}

    # ---- what the model reads
    @property
    def meta(self) -> dict[str, Any]:
        if self.tokenizers is None:
            return {}
        src, tgt = self.tokenizers
        return {"src_vocab_size": src.vocab_size, "tgt_vocab_size": tgt.vocab_size, "pad_id": src.token_to_id(PAD),
                "bos_id": tgt.token_to_id(BOS), "eos_id": tgt.token_to_id(EOS)}

    def model_extras(self) -> dict[str, Any]:
        if self.tokenizers is None:
            return {}
        return {"src_tokenizer": self.tokenizers[0].to_json(), "tgt_tokenizer": self.tokenizers[1].to_json()}

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
            paths = [multi30k_files(self.data_dir, split, lang, self.download) for lang in (self.src_lang, self.tgt_lang)]
            src, tgt = read_pair(*paths, self._hint())
        elif self.source == "hub":
            hub = dict(self.hub or {})
            split_name = hub.pop(f"{split}_split", None) or {"train": "train", "val": "validation", "test": "test"}[split]
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
                src, tgt = read_tsv(Path(spec).expanduser(), self._hint())
            elif len(spec) == 2:
                src, tgt = read_pair(Path(spec[0]).expanduser(), Path(spec[1]).expanduser(), self._hint())
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
        settings = dict(cache_dir=self.cache_dir, vocab_size=self.vocab_size, specials=SPECIALS,
                        min_frequency=self.min_frequency)
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

    def _loader(self, ds: ParallelSet, train: bool) -> DataLoader:
        trainer = self.trainer
        world = trainer.world_size if trainer is not None else 1
        rank = trainer.global_rank if trainer is not None else 0
        sampler = BucketBatchSampler(ds.lengths(), self.batch_size if train else self.eval_batch_size,
                                     self.max_tokens if train else None, shuffle=train, seed=self.seed,
                                     num_replicas=world, rank=rank)
        loader = ResumableDataLoader if train else DataLoader  # training saves its position in checkpoints
        return loader(ds, batch_sampler=sampler, collate_fn=PadCollator(self.meta["pad_id"]),
                      num_workers=self.num_workers, pin_memory=self.pin_memory,
                      persistent_workers=self.num_workers > 0)


def tokenizer_pair(src_json: str, tgt_json: str) -> tuple[TextTokenizer, TextTokenizer]:
    src = tokenizer_from_json(src_json)
    return src, (src if tgt_json == src_json else tokenizer_from_json(tgt_json))
