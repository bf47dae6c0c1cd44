"""GLUE through Hugging Face `datasets` (`data=glue data.task=sst2|cola|mrpc|qnli|rte|...`): the task's text
column(s) (pairs where it has them), its labels with their names, and the splits GLUE scores: train, and the
labelled validation set (GLUE's test labels are hidden) as validation and test. The metrics GLUE reports come
with the classifier: accuracy, F1 of the positive class and Matthews correlation for binary tasks (CoLA is scored by
`val/mcc`, MRPC and QQP by F1 and accuracy, the others by accuracy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.data.text_classification import TextClassificationDataModule
from attnlab.errors import UserError

# task: (text columns, validation split)
TASKS = {"cola": (["sentence"], "validation"), "sst2": (["sentence"], "validation"),
         "mrpc": (["sentence1", "sentence2"], "validation"), "qqp": (["question1", "question2"], "validation"),
         "mnli": (["premise", "hypothesis"], "validation_matched"), "qnli": (["question", "sentence"], "validation"),
         "rte": (["sentence1", "sentence2"], "validation"), "wnli": (["sentence1", "sentence2"], "validation")}
METRIC = {"cola": "val/mcc", "mrpc": "val/f1", "qqp": "val/f1"}  # what GLUE ranks by; accuracy elsewhere


class GlueDataModule(TextClassificationDataModule):
    """Args:
        task: the GLUE task (cola, sst2, mrpc, qqp, mnli, qnli, rte, wnli; stsb is a regression, not served here).
        text_columns: null: the task's own (one column, or the two of a pair).
        path: the hub dataset (nyu-mll/glue), read once online and then from the `datasets` cache.
        local_path: a folder written by `datasets.load_dataset("nyu-mll/glue", task).save_to_disk(folder)`, read
            instead of the hub (machines without network).
        Every other setting is data=text_classification's (tokenizer, max_length, batch_size, ...)."""

    def __init__(self, task: str = "sst2", path: str = "nyu-mll/glue", local_path: str | None = None,
                 name: str = "glue", text_columns: list[str] | None = None, **kw: Any):
        if task not in TASKS:
            regression = (" (stsb is a regression task: attnlab's classifier does not score it)" if task == "stsb"
                          else "")
            raise UserError(f"data.task={task} is not a GLUE classification task{regression}: use one of "
                            f"{', '.join(TASKS)}.")
        columns, self.val_split = TASKS[task]
        if text_columns and list(text_columns) != columns:
            kind = "a sentence-pair task" if len(columns) == 2 else "a single-sentence task"
            raise UserError(f"data.text_columns={list(text_columns)}: GLUE {task} is {kind} with the text column(s) "
                            f"{', '.join(columns)}. Leave data.text_columns=null (the task's own).")
        kw["label_column"] = "label"
        super().__init__(name=f"{name}_{task}", text_columns=text_columns or columns, **kw)
        self.task, self.path, self.local_path = task, path, local_path
        self._names: list[str] | None = None

    def load_rows(self) -> dict[str, list[dict[str, str]]]:
        ds = self._load()
        feature = ds["train"].features.get("label")
        self._names = list(getattr(feature, "names", None) or []) or None
        rows = {}
        for split, name in (("train", "train"), ("val", self.val_split), ("test", self.val_split)):
            part = ds[name]
            labels = [self._names[i] if self._names else str(i) for i in part["label"]]
            texts = [part[c] for c in self.text_columns]
            rows[split] = [{**{c: t[i] for c, t in zip(self.text_columns, texts)}, "label": labels[i]}
                           for i in range(len(part))]
        return rows

    fold_pool = ("train",)  # GLUE's validation set is the test split here: folds divide the training set

    def label_names(self, labels: set[str]) -> list[str]:
        return [n for n in self._names if n in labels] if self._names else super().label_names(labels)

    def corpus_key(self) -> dict:
        return {"glue": self.task, "source": self.local_path or self.path} | self.fold_key()

    def where(self, split: str) -> str:
        return f"GLUE {self.task} ({'train' if split == 'train' else self.val_split})"

    def _load(self):
        import datasets

        if self.local_path:
            folder = Path(self.local_path).expanduser()
            if not folder.is_dir():
                raise UserError(f"data.local_path={folder} does not exist: give the folder written by "
                                f"datasets.load_dataset('{self.path}', '{self.task}').save_to_disk(folder).")
            ds = datasets.load_from_disk(str(folder))
        else:
            cache = self.cache_dir / "hf_datasets"
            try:
                ds = datasets.load_dataset(self.path, self.task, cache_dir=str(cache))
            except Exception as e:  # offline, unknown name
                reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise UserError(
                    f"data=glue data.task={self.task}: could not load '{self.path}' ({self.task}) from the Hugging "
                    f"Face hub ({type(e).__name__}: {reason[:200]}). It is downloaded once and then read from "
                    f"{cache}. Offline: on a machine with network run datasets.load_dataset('{self.path}', "
                    f"'{self.task}').save_to_disk(<folder>), copy the folder here and set data.local_path=<folder>; "
                    "or use data=sst2 (a local copy) or data=text_classification with your own files."
                ) from None
        missing = [s for s in ("train", self.val_split) if s not in ds]
        if missing:
            raise UserError(f"the GLUE {self.task} dataset read has no split {', '.join(missing)} (it has "
                            f"{', '.join(ds)}): save the whole DatasetDict, not one split.")
        return ds
