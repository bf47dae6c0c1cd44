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

import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from attnlab.data.base import BaseDataModule
from attnlab.data.cache import cache_key, file_identity
from attnlab.data.samplers import ResumableDataLoader, ResumableSampler
from attnlab.data.tokenizers import (CLS, EOT, MASK, MLM_SPECIALS, PAD, SEP, CharTokenizer, TextTokenizer,
                                     build_tokenizer)
from attnlab.errors import UserError
from attnlab.types import Encoding, Fraction, PositiveInt, UnitInterval

log = logging.getLogger("attnlab")

OBJECTIVES = ("causal", "masked")
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
SEPARATOR = "\n"  # ends each record (jsonl, parquet, hub) when the tokenizer has no end-of-text token


# ---- documents: where the text comes from

@dataclass
class Source:
    """The documents of one split: `docs()` iterates them; `key` identifies the content for the cache;
    `records` is True for one-document-per-record sources (jsonl, parquet, hub), which get a separator."""

    name: str
    key: Any
    docs: Callable[[], Iterator[str]]
    records: bool = False


def _check_file(path: Path, hint: str | None) -> None:
    if not path.is_file():
        raise UserError(
            f"text file {path} does not exist. "
            + (hint + " " if hint else "")
            + f"Put the file there, or point data.files / data.val_files / data.test_files at your own "
            f"{'/'.join(TEXT_SUFFIXES)} files (paths relative to where you run train.py, or absolute)."
        )
    if path.suffix not in TEXT_SUFFIXES:
        raise UserError(f"{path}: attnlab reads text from {', '.join(TEXT_SUFFIXES)} files; convert it to one "
                        "of them.")
    if path.stat().st_size == 0:
        raise UserError(f"text file {path} is empty: fill it with text (or remove it from data.files).")


def _txt_docs(path: Path, encoding: str = "utf-8") -> Iterator[str]:
    with open(path, encoding=encoding, newline="") as f:
        yield from f  # one document per line, newline kept, so the token stream is the file itself


def _missing_column(path, column: str, available: list[str]) -> UserError:
    return UserError(
        f"{path} has no text column '{column}' (its columns: {', '.join(map(str, available)) or 'none'}). "
        "Set data.text_column to the column that holds the text, e.g. "
        f"data.text_column={available[0] if available else 'text'}."
    )


def _jsonl_docs(path: Path, column: str, encoding: str = "utf-8") -> Iterator[str]:
    with open(path, encoding=encoding) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}, line {n}: not valid JSON ({e}). Each line of a .jsonl file must be one "
                                "JSON object.") from None
            if not isinstance(record, dict) or column not in record:
                raise _missing_column(path, column, list(record) if isinstance(record, dict) else [])
            if record[column]:
                yield str(record[column])


def _parquet_docs(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if column not in pf.schema_arrow.names:
        raise _missing_column(path, column, pf.schema_arrow.names)
    for batch in pf.iter_batches(columns=[column], batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text:
                yield str(text)


def file_source(name: str, files: list[str], text_column: str, hint: str | None, encoding: str = "utf-8") -> Source:
    paths = [Path(f).expanduser() for f in files]
    for p in paths:
        _check_file(p, hint)
    if any(p.suffix != ".txt" for p in paths) and any(p.suffix == ".txt" for p in paths):
        raise UserError(f"data.{name}_files mixes .txt with record files (.jsonl/.parquet): use one kind per split.")

    def docs() -> Iterator[str]:
        for p in paths:
            try:
                if p.suffix == ".txt":
                    yield from _txt_docs(p, encoding)
                elif p.suffix == ".jsonl":
                    yield from _jsonl_docs(p, text_column, encoding)
                else:
                    yield from _parquet_docs(p, text_column)
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{p} is not {encoding} text ({e.reason} at byte {e.start}; data.encoding={encoding}). Give the "
                    "encoding it was written in, e.g. data.encoding=latin-1 (or cp1252, utf-16), or convert it: "
                    f"`iconv -f latin1 -t utf-8 {p.name} > {p.stem}.utf8{p.suffix}`, and point data.files at the "
                    "converted file."
                ) from None

    records = paths[0].suffix != ".txt"
    identity = {"files": [file_identity(p) for p in paths], "column": text_column if records else None}
    if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        identity["encoding"] = encoding  # the tokens cached for a file depend on how it was read
    return Source(name, identity, docs, records)


def hub_source(name: str, hub: dict, split: str, text_column: str, cache_dir: Path,
               skip: int = 0, take: int | None = None) -> Source:
    """Documents of a split of a hub dataset (the first `skip` left out, at most `take`)."""
    key = {"hub": hub, "split": split, "column": text_column, "skip": skip, "take": take}

    def docs() -> Iterator[str]:
        ds = load_hub_split(hub, split, cache_dir)
        columns = ds.column_names or (list(ds.features) if ds.features else None)
        if columns is not None and text_column not in columns:
            raise _missing_column(f"hub dataset {hub['path']} ({split})", text_column, columns)
        if skip:
            ds = ds.skip(skip)
        if take is not None:
            ds = ds.take(take)
        for record in ds:
            if text_column not in record:
                raise _missing_column(f"hub dataset {hub['path']} ({split})", text_column, list(record))
            if record[text_column]:
                yield str(record[text_column])

    return Source(name, key, docs, records=True)


def load_hub_split(hub: dict, split: str, cache_dir: Path,
                   local: str = "train on local files with data=text data.files=[...]"):
    import datasets

    try:
        return datasets.load_dataset(hub["path"], hub.get("name"), split=split, streaming=bool(hub.get("streaming")),
                                     cache_dir=str(Path(cache_dir) / "hf_datasets"))
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as e:
        raise UserError(
            f"could not load the hub dataset '{hub['path']}' (split '{split}'): {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}. Hub datasets need network access the first time "
            f"(they are then cached in {Path(cache_dir) / 'hf_datasets'}); check data.hub.path / data.hub.name / "
            f"the split names, go online, or {local}."
        ) from None


# ---- token arrays on disk

class TokenArray:
    """A slice [start, end) of a memory-mapped token file, opened lazily (so DataLoader workers each map it)."""

    def __init__(self, path: Path, dtype: str, start: int = 0, end: int | None = None):
        self.path, self.dtype = Path(path), dtype
        total = self.path.stat().st_size // np.dtype(dtype).itemsize
        self.start, self.end = start, total if end is None else end
        self._mm: np.memmap | None = None

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def array(self) -> np.ndarray:
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._mm[self.start : self.end]

    def __getstate__(self):
        return self.__dict__ | {"_mm": None}

    def slice(self, a: int, b: int) -> TokenArray:
        return TokenArray(self.path, self.dtype, self.start + a, self.start + b)


def tokenize_to_disk(source: Source, tok: TextTokenizer, out: Path, eot: int | None) -> tuple[Path, Path]:
    """Writes the token ids of all documents to `out`.bin (uint16 when the vocabulary fits) and the token offset
    at which each document ends to `out`.docs.npy. Atomic: a run that stops halfway leaves no cache behind.
    Processes preparing the same split at once (DDP ranks, parallel sweep jobs) take turns through a file lock:
    the first writes it, the others wait and use it."""
    from filelock import FileLock

    bin_path, docs_path = out.with_suffix(".bin"), out.with_suffix(".docs.npy")
    if not (bin_path.is_file() and docs_path.is_file()):
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{out}.lock"):
            if not (bin_path.is_file() and docs_path.is_file()):  # another process may have written them meanwhile
                _write_tokens(source, tok, out, eot)
    return bin_path, docs_path


def _write_tokens(source: Source, tok: TextTokenizer, out: Path, eot: int | None) -> None:
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    bin_path, docs_path = out.with_suffix(".bin"), out.with_suffix(".docs.npy")
    tmp, docs_tmp = (out.with_suffix(f".{os.getpid()}{suffix}.tmp") for suffix in (".bin", ".docs.npy"))
    ends: list[int] = []
    written = 0
    log.info("tokenizing the %s split into %s", source.name, bin_path)
    from tqdm.auto import tqdm

    # a progress bar on a terminal (documents, tokens); HF tokenizers' encode_batch already uses every core
    bar = tqdm(desc=f"tokenizing {source.name}", unit=" docs", disable=None, leave=False)
    with open(tmp, "wb") as f, bar:
        for chunk in _chunks(source.docs(), 8192):
            if source.records and eot is None:  # records separated by newlines when there is no end-of-text token
                chunk = [d if d.endswith(SEPARATOR) else d + SEPARATOR for d in chunk]
            if isinstance(tok, CharTokenizer):
                chunk = [tok.normalize(d) for d in chunk]  # lowercasing may change a document's length
                ids = tok.encode_array("".join(chunk))
                lengths = [len(d) for d in chunk]
            else:
                encoded = tok.encode_batch(chunk)
                if source.records and eot is not None:
                    encoded = [e + [eot] for e in encoded]
                lengths = [len(e) for e in encoded]
                ids = np.fromiter((i for e in encoded for i in e), dtype=np.int64, count=sum(lengths))
            f.write(ids.astype(dtype).tobytes())
            ends.extend((written + np.cumsum(lengths)).tolist())
            written += len(ids)
            bar.update(len(chunk))
            bar.set_postfix_str(f"{written:,} tokens", refresh=False)
    if written == 0:
        tmp.unlink()
        raise UserError(f"the {source.name} split holds no text (0 tokens after tokenization): check its files "
                        "(data.files / data.val_files / data.test_files) or data.text_column.")
    with open(docs_tmp, "wb") as f:
        np.save(f, np.asarray(ends, dtype=np.int64))
    docs_tmp.replace(docs_path)
    tmp.replace(bin_path)


def _chunks(it: Iterator[str], n: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for doc in it:
        chunk.append(doc)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# ---- causal LM: windows

class Windows(Dataset):
    """(x, y) = (tokens[s : s+T], tokens[s+1 : s+T+1]) as int64 tensors of shape (T,).
    Without `starts`, index i is the start itself (any of the len(tokens) - T starts)."""

    def __init__(self, tokens: TokenArray, block_size: int, starts: np.ndarray | None = None):
        self.tokens, self.T, self.starts = tokens, int(block_size), starts

    def __len__(self) -> int:
        return len(self.starts) if self.starts is not None else len(self.tokens) - self.T

    def __getitem__(self, i: int):
        s = int(self.starts[i]) if self.starts is not None else int(i)
        chunk = torch.from_numpy(self.tokens.array[s : s + self.T + 1].astype(np.int64))  # (T + 1,)
        return chunk[:-1], chunk[1:]


class RandomStarts(ResumableSampler, DistributedSampler):
    """`num_samples` window starts per epoch drawn uniformly with replacement (nanoGPT's get_batch), seeded by
    (seed, epoch): a resumed run draws what an uninterrupted one would have, from the batch it stopped at.

    Under DDP each rank takes every num_replicas-th draw (the epoch's draws rounded up to a multiple of
    num_replicas), like EpochShuffleSampler; as a DistributedSampler, Lightning leaves it unwrapped, so a
    resumed run skips inside it."""

    def __init__(self, n: int, num_samples: int, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        DistributedSampler.__init__(self, range(num_samples), num_replicas=num_replicas, rank=rank, shuffle=False,
                                    seed=seed)  # self.num_samples: this rank's share; self.total_size: all ranks'
        self.n = n

    def epoch_indices(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        draws = torch.randint(self.n, (self.total_size,), generator=g)
        return draws[self.rank :: self.num_replicas].tolist()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def fixed_starts(n_tokens: int, block_size: int, seed: int) -> np.ndarray:
    """Non-overlapping window starts covering the split, in a fixed random order."""
    starts = np.arange(0, n_tokens - block_size, block_size)
    return np.random.default_rng(seed).permutation(starts)


# ---- masked LM: packed sequences and dynamic masking

def pack_spans(doc_ends: np.ndarray, start: int, end: int, length: int) -> np.ndarray:
    """Group consecutive documents (lines) of tokens [start, end) into spans of at most `length` tokens, cutting
    only documents longer than `length`. Returns (N, 2) [a, b) offsets relative to `start`."""
    ends = doc_ends[(doc_ends > start) & (doc_ends < end)] - start
    ends = np.append(ends, end - start)
    spans, a, prev = [], 0, 0
    for e in ends.tolist():
        if e - a > length and prev > a:
            spans.append((a, prev))
            a = prev
        while e - a > length:
            spans.append((a, a + length))
            a += length
        prev = e
    if prev > a:
        spans.append((a, prev))
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


class PackedSequences(Dataset):
    """[CLS] tokens[a:b] [SEP] as an int64 tensor of at most max_length ids."""

    def __init__(self, tokens: TokenArray, spans: np.ndarray, cls_id: int, sep_id: int):
        self.tokens, self.spans, self.cls, self.sep = tokens, spans, cls_id, sep_id

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> torch.Tensor:
        a, b = self.spans[i]
        body = torch.from_numpy(self.tokens.array[a:b].astype(np.int64))
        return torch.cat([torch.tensor([self.cls]), body, torch.tensor([self.sep])])


class MaskingCollator:
    """Pads a list of sequences to the longest and masks them (BERT): each real, non-special token is chosen with
    probability `prob`; chosen tokens become [MASK] (80%), a random token (10%) or stay (10%). `labels` holds the
    original id at chosen positions and -100 elsewhere. With `seed`, the masks depend only on the batch (for
    repeatable validation); without, they come from torch's global generator (fresh every batch)."""

    def __init__(self, pad_id: int, mask_id: int, special_ids: list[int], vocab_size: int, prob: float = 0.15,
                 seed: int | None = None):
        self.pad_id, self.mask_id, self.vocab_size, self.prob, self.seed = pad_id, mask_id, vocab_size, prob, seed
        self.special_ids = torch.tensor(sorted(set(special_ids)))

    def __call__(self, seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        B, T = len(seqs), max(len(s) for s in seqs)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        attn = torch.zeros(B, T, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)], attn[i, : len(s)] = s, 1
        g = None
        if self.seed is not None:
            g = torch.Generator().manual_seed(self.seed + int(ids[:, :8].sum()) * 7919 + B * T)
        input_ids, labels = mask_tokens(ids, attn.bool() & ~torch.isin(ids, self.special_ids), self.mask_id,
                                        self.vocab_size, self.prob, g)
        return {"input_ids": input_ids, "attention_mask": attn, "labels": labels}


def mask_tokens(ids: torch.Tensor, candidates: torch.Tensor, mask_id: int, vocab_size: int, prob: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, T), candidates (B, T) bool -> (masked input ids, labels), both (B, T)."""
    chosen = (torch.rand(ids.shape, generator=generator) < prob) & candidates
    if not chosen.any() and candidates.any():  # never a batch without a target
        flat = candidates.flatten().nonzero().squeeze(1)
        chosen.view(-1)[flat[torch.randint(len(flat), (1,), generator=generator)]] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    to_mask = chosen & (roll < 0.8)
    to_random = chosen & (roll >= 0.8) & (roll < 0.9)
    out = ids.masked_fill(to_mask, mask_id)
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator)
    out = torch.where(to_random, random_ids, out)
    return out, labels


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
        self.token_arrays: dict[str, TokenArray] = {}

    # ---- what flows into the model config and the task
    @property
    def meta(self) -> dict[str, Any]:
        if self.tokenizer is None:
            return {}
        return {"vocab_size": self.tokenizer.vocab_size, "block_size": self.block_size, "max_length": self.max_length}

    def model_extras(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.to_json()} if self.tokenizer is not None else {}

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
                             np.load(docs_path))
        if by_fraction:
            tokens, ends = arrays["train"]
            n = len(tokens)
            n_train = int(n * train_fraction)
            n_val = int(n * self.val_fraction) if self.test_fraction > 0 else n - n_train
            arrays = {"train": (tokens.slice(0, n_train), ends), "val": (tokens.slice(n_train, n_train + n_val), ends)}
            if self.test_fraction > 0:
                arrays["test"] = (tokens.slice(n_train + n_val, n), ends)
        if "test" not in arrays:
            log.info("data=%s has no test split: the test split is the validation split", self.name)
            arrays["test"] = arrays["val"]
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
                               seed=None if train else self.seed)

    def _make_loader(self, ds: Dataset, train: bool) -> DataLoader:
        bs = self.batch_size if train else self.eval_batch_size
        sampler = None
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        if train and isinstance(ds, Windows):
            n = self.train_samples_per_epoch or max(bs * world, len(ds.tokens) // self.block_size)
            sampler = RandomStarts(len(ds), int(n), self.seed, num_replicas=world, rank=rank)
        elif train:
            from attnlab.data.samplers import EpochShuffleSampler

            if bs > len(ds):
                raise UserError(f"data.batch_size={bs} is larger than the training split ({len(ds):,} sequences). "
                                f"Set data.batch_size to at most {len(ds)} (or use more text).")
            sampler = EpochShuffleSampler(len(ds), self.seed, num_replicas=world, rank=rank)
        loader = ResumableDataLoader if train else DataLoader  # train: resumes at the batch it stopped at
        return loader(ds, batch_size=bs, sampler=sampler, num_workers=self.num_workers,
                      pin_memory=self.pin_memory, persistent_workers=self.num_workers > 0,
                      drop_last=train, collate_fn=self._collate(train))

    def train_dataloader(self) -> DataLoader:
        return self._make_loader(self.train_set, True)

    def val_dataloader(self) -> DataLoader:
        return self._make_loader(self.val_set, False)

    def test_dataloader(self) -> DataLoader:
        return self._make_loader(self.test_set, False)

