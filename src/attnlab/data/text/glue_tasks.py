"""GLUE's tasks as one table: each task's text columns, labels, what GLUE reports for it (the first metric ranks,
and is the default monitor) and where its files are in the `glue_data/` tree of GLUE's download script; and the
leaderboard's column order. Plain data, importing nothing of attnlab's."""

from __future__ import annotations

from dataclasses import dataclass

DOWNLOAD = ("GLUE's download script (download_glue_data.py, as in google-research/bert: python download_glue_data.py "
            "--data_dir glue_data --tasks all)")


@dataclass(frozen=True)
class GlueTask:
    columns: tuple[str, ...]            # the text columns, as Hugging Face names them
    labels: tuple[str, ...] | None      # the class names in index order (HF's); None: a score to regress
    metrics: tuple[str, ...]            # what GLUE reports, the ranked one first (leaderboard order)
    folder: str                         # in glue_data/
    tsv_text: tuple[str | int, ...]     # the text columns in its .tsv files: header names, or positions
    tsv_label: str | int                # the label column: a header name, or a position (-1: the last)
    header: bool = True                 # CoLA's train.tsv and dev.tsv have none
    val: tuple[str, ...] = ("validation",)   # HF's validation split(s); several: a loader each
    dev: tuple[str, ...] = ("dev.tsv",)      # glue_data's, in the same order


NLI = ("entailment", "neutral", "contradiction")
TASKS = {
    "cola": GlueTask(("sentence",), ("unacceptable", "acceptable"), ("mcc",), "CoLA", (3,), 1, header=False),
    "sst2": GlueTask(("sentence",), ("negative", "positive"), ("acc",), "SST-2", ("sentence",), "label"),
    "mrpc": GlueTask(("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "acc"), "MRPC",
                     ("#1 String", "#2 String"), "Quality"),
    "stsb": GlueTask(("sentence1", "sentence2"), None, ("pearson", "spearman"), "STS-B",
                     ("sentence1", "sentence2"), -1),
    "qqp": GlueTask(("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "acc"), "QQP",
                    ("question1", "question2"), "is_duplicate"),
    "mnli": GlueTask(("premise", "hypothesis"), NLI, ("acc_matched", "acc_mismatched"), "MNLI",
                     ("sentence1", "sentence2"), -1, val=("validation_matched", "validation_mismatched"),
                     dev=("dev_matched.tsv", "dev_mismatched.tsv")),
    "qnli": GlueTask(("question", "sentence"), ("entailment", "not_entailment"), ("acc",), "QNLI",
                     ("question", "sentence"), "label"),
    "rte": GlueTask(("sentence1", "sentence2"), ("entailment", "not_entailment"), ("acc",), "RTE",
                    ("sentence1", "sentence2"), "label"),
    "wnli": GlueTask(("sentence1", "sentence2"), ("not_entailment", "entailment"), ("acc",), "WNLI",
                     ("sentence1", "sentence2"), "label"),
    # the diagnostic: evaluation only, of an MNLI checkpoint; scored by the Matthews correlation over 3 classes
    "ax": GlueTask(("premise", "hypothesis"), NLI, ("mcc",), "diagnostic", ("Premise", "Hypothesis"), "Label",
                   val=("test",), dev=("diagnostic-full.tsv",)),
}
LEADERBOARD = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")  # its column order; ax apart


def val_names(task: str) -> list[str] | None:
    """The validation sets' names where a task has several (MNLI: matched, mismatched)."""
    val = TASKS[task].val
    return [v.rsplit("_", 1)[-1] for v in val] if len(val) > 1 else None


def monitor_of(task: str) -> str:
    """The metric GLUE ranks `task` by, as logged (`val/mcc`, `val/acc_matched`); val/acc for a name it lacks."""
    return f"val/{TASKS[task].metrics[0]}" if task in TASKS else "val/acc"

