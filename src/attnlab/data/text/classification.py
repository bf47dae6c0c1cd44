"""Labelled sentences (or sentence pairs) for classification: GLUE SST-2 (`data=sst2`) or a user's own CSV / TSV /
JSONL files (`data=text_classification`).

Each split is a table with one or two text columns and a label column: class names (strings or ints; the classes
are the training labels, sorted, and a val/test label training never saw is refused), or with `target=scores`
numbers to regress (GLUE's STS-B). A data module may hold several validation sets (GLUE's MNLI: matched,
mismatched): rows `val` and `val_<name>`, a loader each, named to the task through `DataInfo.val_names`.

Text is tokenized with the tokenizer of the weights the run starts from (`model.init_from`: the entry point hands
it over) or a WordPiece vocabulary learned on the training texts, as `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`
with segment ids 0 / 1, cut to max_length. Batches hold sentences of similar length (bucketing) padded to the
longest one: a dict of input_ids, attention_mask, token_type_ids (B, T), labels (B,: class indices, or float
scores) and the texts (for the table of the worst predicted examples).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.compat import keep_own_batch_sampler
from attnlab.data.base import BaseDataModule, kfold
from attnlab.data.cache import cache_key, file_identity
from attnlab.data.info import DataInfo
from attnlab.data.translation.parallel_sets import BucketBatchSampler
from attnlab.data.text.tokenizers import (CLS, EOT, MLM_SPECIALS, PAD, SEP, TextTokenizer, build_tokenizer,
                                     tokenizer_from_json)
from attnlab.errors import UserError
from attnlab.protocols.data import Target
from attnlab.types import Encoding, PositiveInt

log = logging.getLogger("attnlab")

SUFFIXES = (".tsv", ".csv", ".jsonl")


def read_table(path: Path, columns: list[str], encoding: str = "utf-8") -> list[dict[str, str]]:
    """Rows of a .tsv (no quoting, as GLUE's), .csv or .jsonl file, each with the named columns."""
    if path.suffix not in SUFFIXES:
        raise UserError(f"{path}: give a {', '.join(SUFFIXES)} file (one example per row, with a header).")
    if not path.is_file():
        raise UserError(f"{path} does not exist. Check the data.* file settings (or data.root), or fetch the data "
                        "(`make data` for the datasets attnlab knows).")
    try:
        with open(path, encoding=encoding, newline="") as f:
            if path.suffix == ".jsonl":
                rows = [json.loads(line) for line in f if line.strip()]
            else:
                tsv = path.suffix == ".tsv"
                rows = list(csv.DictReader(f, delimiter="\t" if tsv else ",",
                                           quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} cannot be read as {encoding} {path.suffix[1:]} ({e}): fix the file, or give its "
                        "encoding with data.encoding=latin-1 (or cp1252, utf-16).") from None
    header = list(rows[0]) if rows else []
    missing = [c for c in columns if c not in header]
    if missing:
        raise UserError(f"{path} has no column {', '.join(map(repr, missing))} "
                        f"(its columns: {', '.join(header) or 'none'}). Name the text and label columns with "
                        "data.text_columns=[...] and data.label_column=... .")
    return [{c: str(r[c]).strip() for c in columns} for r in rows]


class Encoded(Dataset):
    """Tokenized examples: ids and segment ids per example, the label index, and the text."""

    def __init__(self, ids: list[list[int]], segments: list[list[int]], labels: list[int] | list[float],
                 texts: list[str]):
        self.ids, self.segments, self.labels, self.texts = ids, segments, labels, texts

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"ids": self.ids[i], "segments": self.segments[i], "label": self.labels[i], "text": self.texts[i]}

    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.ids])


class PadBatch:
    """Pads a list of examples to the longest: input_ids, attention_mask, token_type_ids (B, T), labels (B,)."""

    def __init__(self, pad_id: int | None):
        self.pad_id = pad_id or 0  # GPT-2's vocabulary has no padding token: the mask alone marks the padding

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        T = max(len(it["ids"]) for it in items)
        ids = torch.full((len(items), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), T), dtype=torch.long)
        segments = torch.zeros((len(items), T), dtype=torch.long)
        for i, it in enumerate(items):
            ids[i, :len(it["ids"])] = torch.tensor(it["ids"])
            mask[i, :len(it["ids"])] = 1
            segments[i, :len(it["segments"])] = torch.tensor(it["segments"])
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments,
                "labels": torch.tensor([it["label"] for it in items]), "text": [it["text"] for it in items]}


class TextClassificationDataModule(BaseDataModule):
    """Args:
        train / val / test: the split files (.tsv, .csv, .jsonl), relative to `root`; test may be null (then val).
        text_columns: one column (single sentences) or two (pairs: premise / hypothesis, question / sentence).
        label_column: the label, a string or an int per row (a number with target=scores).
        target: classes (a label per row names its class) or scores (a number per row, regressed: STS-B).
        tokenizer: wordpiece (learned on the training texts, tokenizer_vocab_size entries); replaced by the
            tokenizer of the weights the run starts from (model.init_from) when it has one.
        max_length: tokens per example, [CLS]/[SEP] included; longer ones are cut.
        folds / fold: k-fold cross-validation: training and validation rows together, split into `folds`
            stratified folds with the run's seed; fold `fold` validates, the others train (the test split stays
            out). `python train.py -m data.folds=5 data.fold='range(5)'` runs them all.
    """

    def __init__(self, kind: str = "text_classification", name: str = "text_classification", root: str = ".",
                 train: str = "train.tsv", val: str = "dev.tsv", test: str | None = "test.tsv",
                 text_columns: list[str] | None = None, label_column: str = "label", tokenizer: str = "wordpiece",
                 tokenizer_vocab_size: PositiveInt = 8192, lowercase: bool = True, min_frequency: PositiveInt = 2,
                 max_length: PositiveInt = 128, encoding: Encoding = "utf-8", cache_dir: str = ".cache",
                 num_classes: int | None = None, vocab_size: int | None = None, folds: int | None = None,
                 fold: int = 0, target: Literal["classes", "scores"] = "classes", **base: Any):
        super().__init__(kind=kind, **base)
        self.folds, self.fold = folds, int(fold)
        self.name, self.root = name, Path(root).expanduser()
        self.files = {"train": train, "val": val, "test": test or val}
        self.test_is_validation = self.files["test"] == val  # data.test=null: said with the results
        self.text_columns = list(text_columns or ["sentence"])
        if not 1 <= len(self.text_columns) <= 2:
            raise UserError(f"data.text_columns={self.text_columns}: give one column (sentences) or two (pairs).")
        self.label_column, self.tokenizer_kind = label_column, tokenizer
        self.tokenizer_vocab_size, self.lowercase, self.min_frequency = tokenizer_vocab_size, lowercase, min_frequency
        self.max_length, self.encoding, self.cache_dir = int(max_length), encoding, Path(cache_dir)
        self.tokenizer: TextTokenizer | None = None
        self.given_tokenizer: str | None = None
        self.class_names: list[str] | None = None
        self.num_classes = num_classes
        self.target = Target(target)
        self.val_names: list[str] | None = None  # several validation sets: rows "val" (the first), "val_<name>"
        self.rows: dict[str, list[dict[str, str]]] = {}

    fold_pool = ("train", "val")  # the splits data.folds divides (never the test split)

    def use_tokenizer(self, tokenizer_json: str) -> None:
        """The tokenizer of the weights the run starts from (the entry point hands it over before setup)."""
        self.given_tokenizer = tokenizer_json

    def info(self) -> DataInfo:
        if self.tokenizer is None:
            return DataInfo(self.kind)
        scores = self.target is Target.SCORES
        return DataInfo(self.kind, num_classes=1 if scores else len(self.class_names),
                        vocab_size=self.tokenizer.vocab_size, max_length=self.max_length,
                        tokenizer=self.tokenizer.to_json(), class_names=self.class_names, target=self.target,
                        val_names=self.val_names)

    # ---- reading
    def read(self) -> None:
        """Every split's rows, read once and checked: the classes (or scores), labels training never saw."""
        if self.rows:
            return
        self.rows = self.load_rows()
        if self.folds:  # k-fold cross-validation over training + validation; the test split stays out
            pool = [r for split in self.fold_pool for r in self.rows[split]]
            train, val = kfold([r[self.label_column] for r in pool], int(self.folds), self.fold, self.seed)
            self.rows = self.rows | {"train": [pool[i] for i in train], "val": [pool[i] for i in val]}
        if self.target is Target.SCORES:
            self.class_names = None
            for split, rows in self.rows.items():
                bad = next((r[self.label_column] for r in rows if not _is_number(r[self.label_column])), None)
                if bad is not None:
                    raise UserError(f"the {split} data {self.where(split)} has the label {bad!r} in column "
                                    f"{self.label_column!r}: data.target=scores regresses numbers. Fix the row, or "
                                    "set data.target=classes for class labels.")
            return
        labels = self.label_names({r[self.label_column] for r in self.rows["train"]})
        if len(labels) < 2:
            raise UserError(f"the training data {self.where('train')} has {len(labels)} label value(s) in "
                            f"column {self.label_column!r}: a classifier needs at least two classes. Check "
                            "data.label_column.")
        for split in (s for s in self.rows if s != "train"):
            unseen = sorted({r[self.label_column] for r in self.rows[split]} - set(labels))
            if unseen:
                raise UserError(f"the {split} data {self.where(split)} has labels the training data never "
                                f"has: {', '.join(unseen[:5])}. The classes are the training labels "
                                f"({', '.join(labels[:10])}): fix or drop those rows.")
        if self.num_classes is not None and int(self.num_classes) != len(labels):
            raise UserError(f"data.num_classes={self.num_classes} but the training file has {len(labels)} labels "
                            f"({', '.join(labels[:10])}): remove data.num_classes (it is found from the data).")
        self.class_names = labels

    def load_rows(self) -> dict[str, list[dict[str, str]]]:
        """{split: rows}, each row {column: text} with the text columns and the label as strings."""
        columns = self.text_columns + [self.label_column]
        return {s: read_table(self.root / f, columns, self.encoding) for s, f in self.files.items()}

    def label_names(self, labels: set[str]) -> list[str]:
        """The classes in their index order: integer labels numerically (0, 1, 2, 10), others alphabetically."""
        return sorted(labels, key=_label_order)

    def corpus_key(self) -> dict:
        """What identifies the training texts (the cache key of the tokenizer learned on them)."""
        return {"files": file_identity(self.root / self.files["train"]), "columns": self.text_columns} | self.fold_key()

    def fold_key(self) -> dict:
        return {"folds": self.folds, "fold": self.fold, "seed": self.seed} if self.folds else {}

    def where(self, split: str) -> str:
        return str(self.root / self.files.get(split, split))

    def make_tokenizer(self) -> TextTokenizer:
        """The tokenizer the text is read with: the one handed over (use_tokenizer), else one learned on the
        training texts (cached)."""
        if self.given_tokenizer:
            return tokenizer_from_json(self.given_tokenizer)
        texts = [r[c] for r in self.rows["train"] for c in self.text_columns]
        corpus = cache_key(self.corpus_key())
        tok, _ = build_tokenizer(self.tokenizer_kind, corpus, lambda: iter(texts), lambda: iter(texts),
                                 self.cache_dir, self.tokenizer_vocab_size, list(MLM_SPECIALS), self.lowercase,
                                 self.min_frequency)
        return tok

    def _encode(self, split: str) -> Encoded:
        tok, rows = self.tokenizer, self.rows[split]
        columns = [tok.encode_batch([r[c] for r in rows]) for c in self.text_columns]
        ids, segments = [], []
        for parts in zip(*columns):
            seq, seg = join_texts(tok, list(parts), self.max_length)
            ids.append(seq)
            segments.append(seg)
        texts = [" ||| ".join(r[c] for c in self.text_columns) for r in rows]
        if self.target is Target.SCORES:
            return Encoded(ids, segments, [float(r[self.label_column]) for r in rows], texts)
        index = {name: i for i, name in enumerate(self.class_names)}
        return Encoded(ids, segments, [index[r[self.label_column]] for r in rows], texts)

    def prepare_data(self) -> None:
        self.read()

    def build_splits(self):
        self.read()
        if self.tokenizer is None:
            self.tokenizer = self.make_tokenizer()
        labels = (f"{len(self.class_names)} classes ({', '.join(self.class_names[:10])})" if self.class_names
                  else "scores to regress")
        log.info("data=%s: %s examples, %s, vocabulary %d", self.name,
                 " / ".join(f"{s} {len(r):,}" for s, r in self.rows.items()), labels, self.tokenizer.vocab_size)
        train = self._encode("train") if self.rows["train"] else None
        if not self.val_names:
            return train, self._encode("val"), self._encode("test")
        # several validation sets, which are also the test sets (GLUE's labelled ones)
        sets = [self._encode(k) for k in ["val", *(f"val_{n}" for n in self.val_names[1:])]]
        return train, sets, sets

    def val_dataloader(self):
        if isinstance(self.val_set, list):  # one loader per validation set, in val_names' order
            return [self._loader(ds, train=False) for ds in self.val_set]
        return super().val_dataloader()

    def test_dataloader(self):
        if isinstance(self.test_set, list):
            return [self._loader(ds, train=False) for ds in self.test_set]
        return super().test_dataloader()

    # ---- loaders: bucketed by length, padded to the longest in the batch
    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.trainer is not None:  # the batch samplers shard by rank themselves
            keep_own_batch_sampler(self.trainer)

    def batch_sampler(self, ds: Encoded, train: bool, world: int, rank: int) -> BucketBatchSampler:
        return BucketBatchSampler(ds.lengths(), self.batch_size if train else self.eval_batch_size, None,
                                  shuffle=train, seed=self.seed, num_replicas=world, rank=rank)

    def collate_fn(self, train: bool) -> PadBatch:
        return PadBatch(self.tokenizer.token_to_id(PAD))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _label_order(label: str):
    """Integer labels in numeric order (0, 1, 2, 10), others alphabetically."""
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)


def join_texts(tok: TextTokenizer, parts: list[list[int]], max_length: int) -> tuple[list[int], list[int]]:
    """One example's token ids and segment ids from its texts' tokens, cut to max_length (longest text first).
    BERT's layout where the vocabulary has [CLS]: [CLS] a [SEP] (b [SEP]), segments 0 (1); a decoder's otherwise
    (GPT-2's vocabulary): a (<|endoftext|> b), which the classifier reads at the last token."""
    cls_id = tok.token_to_id(CLS)
    sep_id = tok.token_to_id(SEP) if cls_id is not None else tok.token_to_id(EOT)
    ends = [[sep_id] if cls_id is not None or (sep_id is not None and s < len(parts) - 1) else []
            for s in range(len(parts))]
    parts = _truncate(parts, max_length - (cls_id is not None) - sum(map(len, ends)))
    seq, seg = ([cls_id], [0]) if cls_id is not None else ([], [])
    for s, part in enumerate(parts):
        seq += part + ends[s]
        seg += [s] * (len(part) + len(ends[s]))
    return seq, seg


def _truncate(parts: list[list[int]], budget: int) -> list[list[int]]:
    """Cut the longest text first until the total fits (HF's `longest_first`)."""
    while sum(map(len, parts)) > budget:
        longest = max(range(len(parts)), key=lambda i: len(parts[i]))
        parts[longest] = parts[longest][:-1]
    return parts
