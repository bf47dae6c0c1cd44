"""GLUE (`data=glue data.task=cola|sst2|mrpc|stsb|qqp|mnli|qnli|rte|wnli|ax`): each task's text column(s), its
labels (class names, or STS-B's similarity score in [0, 5] to regress) and the splits GLUE scores: train, and the
labelled validation set as validation and test (GLUE's test labels are hidden). MNLI has two validation sets,
matched and mismatched, each its own loader. AX is evaluation only: an MNLI checkpoint's diagnostic.

Read from one of three forms: Hugging Face's hub (then its cache), a `datasets` `save_to_disk` folder, or the
`glue_data/` tree of GLUE's download script (`<TASK>/{train,dev,test}.tsv`, each task with its own columns).
What each task holds and reports: attnlab.data.text.glue_tasks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from attnlab.data.text.glue_tasks import DOWNLOAD, TASKS, val_names
from attnlab.data.text.classification import TextClassificationDataModule
from attnlab.errors import UserError

log = logging.getLogger("attnlab")

class GlueDataModule(TextClassificationDataModule):
    """Args:
        task: the GLUE task: cola, sst2, mrpc, stsb (a regression), qqp, mnli, qnli, rte, wnli, or ax (evaluation
            only, of an MNLI checkpoint: python eval.py ckpt_path=<mnli run> +data.task=ax).
        text_columns: null: the task's own (one column, or the two of a pair).
        path: the hub dataset (nyu-mll/glue), read once online and then from the `datasets` cache.
        local_path: read instead of the hub (machines without network): a folder written by
            `datasets.load_dataset("nyu-mll/glue", task).save_to_disk(folder)`, a folder of such folders named by
            task, or the `glue_data/` tree of GLUE's download script.
        monitor: the metric the task is ranked by (conf/data/glue.yaml: GLUE's own); the classifier's
            model.monitor follows it, and refuses one it does not log.
        Every other setting is data=text_classification's (tokenizer, max_length, batch_size, ...)."""

    def __init__(self, task: str = "sst2", path: str = "nyu-mll/glue", local_path: str | None = None,
                 name: str = "glue", text_columns: list[str] | None = None, monitor: str | None = None, **kw: Any):
        if task not in TASKS:
            raise UserError(f"data.task={task} is not a GLUE task: use one of {', '.join(TASKS)}.")
        spec = TASKS[task]
        if text_columns and list(text_columns) != list(spec.columns):
            kind = "a sentence-pair task" if len(spec.columns) == 2 else "a single-sentence task"
            raise UserError(f"data.text_columns={list(text_columns)}: GLUE {task} is {kind} with the text column(s) "
                            f"{', '.join(spec.columns)}. Leave data.text_columns=null (the task's own).")
        kw |= {"label_column": "label", "target": "scores" if spec.labels is None else "classes"}
        super().__init__(name=f"{name}_{task}", text_columns=text_columns or list(spec.columns), **kw)
        self.task, self.spec, self.path, self.local_path, self.monitor = task, spec, path, local_path, monitor
        self.val_names = val_names(task)
        self.test_is_validation = True  # GLUE's test labels are hidden: its validation sets are the test

    fold_pool = ("train",)  # GLUE's validation set is the test split here: folds divide the training set

    def load_rows(self) -> dict[str, list[dict[str, str]]]:
        splits = _read_tsv_tree(self) if self._tsv_folder() is not None else _read_datasets(self)
        vals = [splits[v] for v in self.spec.val]
        rows = {"train": splits.get("train", []), "val": vals[0], "test": vals[0]}
        for name, more in zip((self.val_names or [])[1:], vals[1:]):
            rows[f"val_{name}"] = more
        val = vals[0]
        if self.spec.labels is not None and any(r["label"] == "" for r in val):
            where = self.where("val")
            raise UserError(f"GLUE {self.task}'s labels are hidden in {where} (as GLUE's test sets are): it can "
                            "be predicted (predict.py) but not scored. For AX, put GLUE's diagnostic-full.tsv, "
                            f"which has the labels, in <glue_data>/diagnostic/ ({DOWNLOAD} fetches it).")
        return rows

    def label_names(self, labels: set[str]) -> list[str]:
        return list(self.spec.labels) if self.spec.labels else super().label_names(labels)

    def read(self) -> None:
        if self.task == "ax":  # evaluation only: the classes are MNLI's, there is no training data
            if not self.rows:
                self.rows = self.load_rows()
            self.class_names = list(self.spec.labels)
            return
        super().read()

    def train_dataloader(self):
        if self.task == "ax":
            raise UserError("data.task=ax is GLUE's diagnostic, for evaluation only: train on MNLI "
                            "(data.task=mnli), then evaluate that checkpoint on it with python eval.py "
                            "ckpt_path=<the MNLI run> +data.task=ax.")
        return super().train_dataloader()

    def corpus_key(self) -> dict:
        return {"glue": self.task, "source": self.local_path or self.path} | self.fold_key()

    def make_tokenizer(self):
        if self.task == "ax" and not self.given_tokenizer:
            raise UserError("data.task=ax has no training text to learn a vocabulary from: it reads the text with "
                            "the tokenizer of the MNLI checkpoint it evaluates (python eval.py ckpt_path=<the MNLI "
                            "run> +data.task=ax).")
        return super().make_tokenizer()

    def where(self, split: str) -> str:
        names = {"train": "train", "val": self.spec.val[0], "test": self.spec.val[0]}
        names |= {f"val_{n}": v for n, v in zip(self.val_names or [], self.spec.val)}
        name = names.get(split, split)
        return f"GLUE {self.task} ({name}{', ' + str(self.local_path) if self.local_path else ''})"

    # ---- the three forms
    def _tsv_folder(self) -> Path | None:
        """The task's folder of .tsv files when local_path is a glue_data tree (or that folder itself)."""
        if not self.local_path:
            return None
        root = Path(self.local_path).expanduser()
        for folder in (root / self.spec.folder, root):
            if any((folder / f).is_file() for f in ("train.tsv", *self.spec.dev)):
                return folder
        return None


def _read_datasets(dm: GlueDataModule) -> dict[str, list[dict[str, str]]]:
    """{split: rows} from the hub (its cache) or a save_to_disk folder: train, then the validation set(s)."""
    import datasets

    spec, wanted = dm.spec, ([] if dm.task == "ax" else ["train"]) + list(dm.spec.val)
    if dm.local_path:
        root = Path(dm.local_path).expanduser()
        folder = next((f for f in (root, root / dm.task) if (f / "dataset_dict.json").is_file()), None)
        if folder is None:
            raise UserError(
                f"data.local_path={root} holds no GLUE {dm.task}: give a folder written by datasets.load_dataset("
                f"'{dm.path}', '{dm.task}').save_to_disk(folder) (or a folder of such folders named by task), or "
                f"the glue_data/ tree of {DOWNLOAD}, which has {spec.folder}/{', '.join(('train.tsv',) + spec.dev)}.")
        ds = datasets.load_from_disk(str(folder))
    else:
        cache = dm.cache_dir / "hf_datasets"
        try:
            ds = datasets.load_dataset(dm.path, dm.task, cache_dir=str(cache))
        except Exception as e:  # offline, unknown name
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise UserError(
                f"data=glue data.task={dm.task}: could not load '{dm.path}' ({dm.task}) from the Hugging Face hub "
                f"({type(e).__name__}: {reason[:200]}). It is downloaded once and then read from {cache}. Offline: "
                f"set data.local_path to the glue_data/ tree of {DOWNLOAD}, or to a folder written on a machine "
                f"with network by datasets.load_dataset('{dm.path}', '{dm.task}').save_to_disk(<folder>)."
            ) from None
    missing = [s for s in wanted if s not in ds]
    if missing:
        raise UserError(f"the GLUE {dm.task} dataset read has no split {', '.join(missing)} (it has "
                        f"{', '.join(ds)}): save the whole DatasetDict, not one split.")
    out = {}
    for split in wanted:
        part = ds[split]
        texts = [part[c] for c in spec.columns]
        labels = part["label"]
        out[split] = [{**{c: t[i].strip() for c, t in zip(spec.columns, texts)}, "label": _label(spec, labels[i])}
                      for i in range(len(part))]
    return out


def _label(spec, value) -> str:
    """A label as the rows hold it: the class name (HF's index, or glue_data's 0/1 or name), the score, or ""
    where it is hidden (-1, or a file without labels)."""
    if value is None or value == "" or (spec.labels is not None and str(value) == "-1"):
        return ""
    if spec.labels is None:
        return f"{float(value):.6g}"  # float32 in datasets, 3 decimals in glue_data: the same score
    text = str(value)
    return spec.labels[int(text)] if text.isdigit() and int(text) < len(spec.labels) else text


def _read_tsv_tree(dm: GlueDataModule) -> dict[str, list[dict[str, str]]]:
    """{split: rows} from a glue_data/<TASK>/ folder: train.tsv (none for AX), then the dev file(s)."""
    folder, spec = dm._tsv_folder(), dm.spec
    files = ([] if dm.task == "ax" else [("train", "train.tsv")]) + list(zip(spec.val, spec.dev))
    if dm.task == "ax" and not (folder / spec.dev[0]).is_file() and (folder / "diagnostic.tsv").is_file():
        files = [("test", "diagnostic.tsv")]  # the unlabelled diagnostic (refused for scoring: no labels)
    missing = [f for _, f in files if not (folder / f).is_file()]
    if missing:
        raise UserError(f"{folder} has no {', '.join(missing)}: GLUE {dm.task}'s glue_data folder holds "
                        f"{', '.join(f for _, f in files)}, as {DOWNLOAD} writes them. Fetch it again, or point "
                        "data.local_path at the glue_data/ folder itself.")
    out = {}
    for split, name in files:
        out[split] = _tsv_rows(folder / name, spec, dm)
    return out


def _tsv_rows(path: Path, spec, dm: GlueDataModule) -> list[dict[str, str]]:
    """One GLUE .tsv file's rows (no quoting, as GLUE's processors read them). Rows with another number of fields
    than the file's first line (QQP has a few) are skipped, and counted in one line."""
    try:
        lines = path.read_text(encoding=dm.encoding).splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} cannot be read as {dm.encoding} ({e}): fetch the file again, or give its "
                        "encoding with data.encoding=latin-1.") from None
    lines = [ln.split("\t") for ln in lines if ln.strip()]
    if not lines:
        return []
    header = lines.pop(0) if spec.header else None
    if header is not None and path.name == "diagnostic.tsv":  # index sentence1 sentence2: no labels
        at = [header.index("sentence1"), header.index("sentence2"), None]
    else:
        named = [*spec.tsv_text, spec.tsv_label]
        try:
            at = [n if isinstance(n, int) else header.index(n) for n in named]
        except ValueError:
            raise UserError(f"{path}'s header ({', '.join(header)}) lacks GLUE {dm.task}'s columns "
                            f"({', '.join(map(str, named))}): it is not the file {DOWNLOAD} writes.") from None
    width = len(header) if header is not None else len(lines[0])
    rows, skipped = [], 0
    for fields in lines:
        if len(fields) != width:
            skipped += 1
            continue
        texts = [fields[i].strip() for i in at[:-1]]
        label = _label(spec, fields[at[-1]].strip()) if at[-1] is not None else ""
        rows.append({**dict(zip(spec.columns, texts)), "label": label})
    if skipped:
        log.warning("%s: %d malformed row(s) skipped (not %d tab-separated fields), %d read", path, skipped, width,
                    len(rows))
    return rows
