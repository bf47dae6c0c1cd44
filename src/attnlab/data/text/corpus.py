"""Text corpora for language modelling: local .txt/.jsonl/.parquet files or a Hugging Face hub dataset,
tokenized once into memory-mapped token arrays under the cache directory.

- objective=causal (GPT): training samples are random contiguous windows of block_size + 1 tokens
  (input = the first block_size, target = the same shifted by one); validation uses a fixed, shuffled set of
  non-overlapping windows, so `limit_val_batches` evaluates a random but repeatable sample.
- objective=masked (BERT): consecutive lines/documents are packed into sequences of at most max_length tokens,
  [CLS] ... [SEP], and each batch is masked afresh (15% of the tokens: 80% [MASK], 10% random, 10% kept).

Splits come from `files` / `val_files` / `test_files`; without val_files, the last val_fraction of the tokens
of `files` is the validation split (nanoGPT's first 90% / last 10%), and the test split is the validation split
unless test_fraction > 0.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from attnlab.data.base import BaseDataModule
from attnlab.data.cache import cache_key
from attnlab.data.info import DataInfo
from attnlab.data.text.lm_datasets import (MaskingCollator, PackedSequences, RandomStarts, Windows, fixed_starts,
                                      pack_spans)
from attnlab.data.text.sources import OBJECTIVES, SEPARATOR, Source, file_source, hub_source
from attnlab.data.text.token_arrays import TokenArray, tokenize_to_disk
from attnlab.data.text.tokenizers import (CLS, EOT, MASK, MLM_SPECIALS, PAD, SEP, TextTokenizer, build_tokenizer,
                                     tokenizer_from_json)
from attnlab.errors import UserError
from attnlab.types import Encoding, Fraction, PositiveInt, UnitInterval

log = logging.getLogger("attnlab")


# ---- the DataModule

def _as_list(files) -> list[str] | None:
    """data.files=path.txt means [path.txt] (not its characters)."""
    if not files:
        return None
    return [str(files)] if isinstance(files, (str, os.PathLike)) else [str(f) for f in files]


class TextDataModule(BaseDataModule):
    """Args (beyond BaseDataModule's):
        files / val_files / test_files: local .txt (one document per line, newlines kept), .jsonl or .parquet.
        hub: a hub dataset instead of files: {path, name, split, val_split, test_split, streaming,
            max_documents, val_documents}; without val_split the first val_documents documents are the
            validation split.
        text_column: the field holding the text in .jsonl / .parquet / hub records.
        tokenizer: char | bpe | wordpiece | pretrained (with pretrained_tokenizer=<hub name>).
        tokenizer_vocab_size: the vocabulary BPE/WordPiece learn (the real size is `meta['vocab_size']`).
        objective: causal (GPT windows of block_size) or masked (BERT sequences of max_length).
        train_samples_per_epoch: windows per training epoch (default: as many as tokens / block_size).
        download_hint: appended to the error when a file is missing (where to get it).
    """

    def __init__(
        self,
        kind: str = "text",
        name: str = "text",
        files: list[str] | None = None,
        val_files: list[str] | None = None,
        test_files: list[str] | None = None,
        hub: dict | None = None,
        text_column: str = "text",
        encoding: Encoding = "utf-8",
        val_fraction: Fraction = 0.1,
        test_fraction: Fraction = 0.0,
        tokenizer: str = "char",
        tokenizer_vocab_size: int | None = None,
        pretrained_tokenizer: str | None = None,
        lowercase: bool = False,
        min_frequency: int = 2,
        objective: str = "causal",
        block_size: PositiveInt = 256,
        max_length: PositiveInt = 128,
        mlm_probability: UnitInterval = 0.15,
        train_samples_per_epoch: int | None = None,
        cache_dir: str = ".cache/attnlab",
        download_hint: str | None = None,
        vocab_size: int | None = None,  # written back from `meta`; an input only for the model config
        **kwargs: Any,
    ):
        super().__init__(kind=kind, **kwargs)
        if objective not in OBJECTIVES:
            raise UserError(f"data.objective={objective} is not one of {', '.join(OBJECTIVES)}.")
        if not files and not hub:
            raise UserError(f"data={name} has no text: set data.files=[path/to/text.txt, ...] (local .txt, .jsonl "
                            "or .parquet files) or use data=hf_text data.hub.path=<hub dataset>.")
        files, val_files, test_files = (_as_list(f) for f in (files, val_files, test_files))
        self.name, self.files, self.val_files, self.test_files, self.hub = name, files, val_files, test_files, hub
        self.encoding = encoding
        self.text_column, self.val_fraction, self.test_fraction = text_column, float(val_fraction), float(test_fraction)
        self.tokenizer_kind, self.tokenizer_vocab_size = tokenizer, tokenizer_vocab_size
        self.pretrained_tokenizer, self.lowercase, self.min_frequency = pretrained_tokenizer, lowercase, min_frequency
        self.objective, self.block_size, self.max_length = objective, int(block_size), int(max_length)
        self.mlm_probability, self.train_samples_per_epoch = float(mlm_probability), train_samples_per_epoch
        self.cache_dir, self.download_hint = Path(cache_dir), download_hint
        self.tokenizer: TextTokenizer | None = None
        self.given_tokenizer: str | None = None
        self.token_arrays: dict[str, TokenArray] = {}

    def use_tokenizer(self, tokenizer_json: str) -> None:
        """The tokenizer of the weights the run starts from (model.init_from; the entry point hands it over before
        setup): the text is read with it instead of a trained or named one."""
        self.given_tokenizer = tokenizer_json

    # ---- what flows into the model config and the task
    def info(self) -> DataInfo:
        if self.tokenizer is None:
            return DataInfo(self.kind)
        return DataInfo(self.kind, objective=self.objective, vocab_size=self.tokenizer.vocab_size,
                        block_size=self.block_size, max_length=self.max_length, tokenizer=self.tokenizer.to_json())

    # ---- sources and splits
    def _sources(self) -> tuple[dict[str, Source], bool]:
        """({split: Source}, whether val/test are cut from the training source by fraction)."""
        if self.hub:
            hub = dict(self.hub)
            split, val_split = hub.pop("split", "train"), hub.pop("val_split", None)
            test_split = hub.pop("test_split", None)
            take, val_docs = hub.pop("max_documents", None), int(hub.pop("val_documents", 0) or 0)
            hub.setdefault("path", None)
            if not hub["path"]:
                raise UserError("data.hub.path is empty: name a hub dataset, e.g. "
                                "data.hub.path=Skylion007/openwebtext.")
            skip = 0 if val_split else val_docs
            if not val_split and not val_docs:
                raise UserError(f"hub dataset {hub['path']}: set data.hub.val_split=<split name> or "
                                "data.hub.val_documents=<n> (the first n documents become the validation split).")
            src = {"train": hub_source("train", hub, split, self.text_column, self.cache_dir, skip, take)}
            src["val"] = (hub_source("val", hub, val_split, self.text_column, self.cache_dir) if val_split else
                          hub_source("val", hub, split, self.text_column, self.cache_dir, 0, val_docs))
            if test_split:
                src["test"] = hub_source("test", hub, test_split, self.text_column, self.cache_dir)
            return src, False
        src = {"train": file_source("train", list(self.files), self.text_column, self.download_hint, self.encoding)}
        for split, files in (("val", self.val_files), ("test", self.test_files)):
            if files:
                src[split] = file_source(split, list(files), self.text_column, self.download_hint, self.encoding)
        by_fraction = "val" not in src
        if by_fraction and not 0 < self.val_fraction < 1:
            raise UserError(f"data.val_fraction={self.val_fraction}: give a fraction in (0, 1), or data.val_files.")
        return src, by_fraction

    def _train_texts(self, src: Source, fraction: float) -> Callable[[], Iterator[str]]:
        """The first `fraction` of the characters of `src` (the training part of a fraction split), the document
        that crosses into the validation part cut where it does, so a trained tokenizer never sees validation
        text. Counted only when a tokenizer is trained (not when it comes from the cache)."""
        if fraction >= 1:
            return src.docs

        def docs():
            budget = int(fraction * sum(len(d) for d in src.docs()))
            for d in src.docs():
                if budget <= 0:
                    return
                yield d[:budget]
                budget -= len(d)

        return docs

    def _specials(self) -> list[str]:
        """Special tokens a trained tokenizer reserves: BERT's for masked LM (and for WordPiece, which needs
        [UNK]); GPT-2's <|endoftext|> between documents for causal BPE; none for characters in causal LM."""
        if self.tokenizer_kind == "pretrained":
            return []
        if self.objective == "masked" or self.tokenizer_kind == "wordpiece":
            return list(MLM_SPECIALS)
        return [EOT] if self.tokenizer_kind == "bpe" else []

    def prepare_data(self) -> None:
        self._prepare()

    def _prepare(self) -> None:
        if self.tokenizer is not None:
            return
        src, by_fraction = self._sources()
        train_fraction = 1 - self.val_fraction - self.test_fraction if by_fraction else 1.0
        corpus = {k: s.key for k, s in src.items()} | ({"fraction": [self.val_fraction, self.test_fraction]}
                                                       if by_fraction else {})

        def all_texts():
            for s in src.values():
                yield from s.docs()

        separator = SEPARATOR if any(s.records for s in src.values()) else ""
        if self.given_tokenizer:
            self.tokenizer, tok_key = tokenizer_from_json(self.given_tokenizer), cache_key(self.given_tokenizer)
        else:
            self.tokenizer, tok_key = build_tokenizer(
                self.tokenizer_kind, cache_key(corpus), self._train_texts(src["train"], train_fraction), all_texts,
                self.cache_dir, self.tokenizer_vocab_size, self._specials(), self.lowercase, self.min_frequency,
                self.pretrained_tokenizer, extra_chars=separator)
        eot = self.tokenizer.token_to_id(EOT)
        folder = self.cache_dir / "text" / f"{self.name}-{cache_key([corpus, tok_key])}"
        arrays = {}
        for split, s in src.items():
            bin_path, docs_path = tokenize_to_disk(s, self.tokenizer, folder / split, eot)
            arrays[split] = (TokenArray(bin_path, "uint16" if self.tokenizer.vocab_size <= 2**16 else "uint32"),
                             np.load(docs_path, mmap_mode="r"))  # read where needed: flat in corpus size
        if by_fraction:
            tokens, ends = arrays["train"]
            n = len(tokens)
            n_train = int(n * train_fraction)
            n_val = int(n * self.val_fraction) if self.test_fraction > 0 else n - n_train
            arrays = {"train": (tokens.slice(0, n_train), ends), "val": (tokens.slice(n_train, n_train + n_val), ends)}
            if self.test_fraction > 0:
                arrays["test"] = (tokens.slice(n_train + n_val, n), ends)
        if "test" not in arrays:  # eval.py tests on it; train.py does not pass over the validation split twice
            log.info("data=%s has no test split: the test split is the validation split", self.name)
            arrays["test"] = arrays["val"]
            self.test_is_validation = True
        self._arrays = arrays
        self.token_arrays = {k: v[0] for k, v in arrays.items()}
        log.info("data=%s: vocabulary %d, tokens %s", self.name, self.tokenizer.vocab_size,
                 ", ".join(f"{k} {len(v):,}" for k, v in self.token_arrays.items()))

    def _split_dataset(self, split: str) -> Dataset:
        tokens, ends = self._arrays[split]
        if self.objective == "causal":
            if len(tokens) <= self.block_size + 1:
                raise UserError(
                    f"the {split} split of data={self.name} has {len(tokens):,} tokens, not enough for one window of "
                    f"data.block_size={self.block_size}: use more text or a smaller data.block_size."
                )
            if split == "train":
                return Windows(tokens, self.block_size)
            return Windows(tokens, self.block_size, fixed_starts(len(tokens), self.block_size, seed=0))
        spans = pack_spans(ends, tokens.start, tokens.end, self.max_length - 2)
        tok = self.tokenizer
        cls_id, sep_id = (tok.special_id(t, "masked-LM data") for t in (CLS, SEP))
        return PackedSequences(tokens, spans, cls_id, sep_id)

    def build_splits(self):
        self._prepare()
        return self._split_dataset("train"), self._split_dataset("val"), self._split_dataset("test")

    # ---- loaders
    def _collate(self, train: bool):
        if self.objective == "causal":
            return None
        tok = self.tokenizer
        specials = [tok.special_id(t, "masked-LM data") for t in (PAD, CLS, SEP, MASK)]
        return MaskingCollator(specials[0], specials[3], specials, tok.vocab_size, self.mlm_probability,
                               seed=None if train else self.seed, max_length=self.max_length)

    def train_sampler(self, ds: Dataset, batch_size: int, world: int, rank: int):
        if isinstance(ds, Windows):  # random windows, as many per epoch as the tokens fill (or as configured)
            n = self.train_samples_per_epoch or max(batch_size * world, len(ds.tokens) // self.block_size)
            return RandomStarts(len(ds), int(n), self.seed, num_replicas=world, rank=rank)
        return super().train_sampler(ds, batch_size, world, rank)

    def collate_fn(self, train: bool):
        return self._collate(train)

    def loader_generator(self) -> None:
        return None  # the samplers hold their own seeds
