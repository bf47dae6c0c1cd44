"""Miniature GLUE: every task in the two forms people hold offline, written by the tests.

- `write_tsv_tree(root)`: the `glue_data/` tree of GLUE's download script, with its quirks: CoLA's train.tsv and
  dev.tsv without a header, MRPC's `Quality #1 ID #2 ID #1 String #2 String`, STS-B's score in the last column,
  MNLI's dev_matched.tsv and dev_mismatched.tsv (label1..label5, gold_label last), QQP with malformed rows, AX's
  diagnostic-full.tsv.
- `write_saved(root)`: a `datasets` `save_to_disk` folder per task, named by task, with HF's features (class labels
  by name, STS-B's float score, MNLI's validation_matched / validation_mismatched, AX's test split; test labels -1).

The texts carry their label (a word per class, a word count for a score) so that a few steps learn something.
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = "the a cat dog sat ran on under mat rug big small red blue quick slow old new tree house".split()
CUE = {0: "alpha", 1: "beta", 2: "gamma"}
TRAIN, DEV = 48, 16
MALFORMED_QQP = 2  # rows of QQP's train.tsv with a field too few


def _sentence(rng: random.Random, label: int | float, n: int = 6) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    cue = CUE[int(label)] if isinstance(label, int) else " ".join(["sim"] * int(round(label)))
    if cue:
        words.insert(rng.randrange(len(words)), cue)
    return " ".join(words)


def examples(task: str, n: int, seed: int) -> list[dict]:
    """Rows {text columns..., label} for a task: label an int (the class index) or a float (STS-B)."""
    rng = random.Random(f"{task}-{seed}")
    k = 3 if task in ("mnli", "ax") else 2
    rows = []
    for i in range(n):
        label = round(rng.uniform(0, 5), 2) if task == "stsb" else i % k
        a = _sentence(rng, label)
        rows.append({"a": a, "b": _sentence(rng, label), "label": label})
    return rows


NLI = ["entailment", "neutral", "contradiction"]
NAMES = {"cola": None, "sst2": None, "mrpc": None, "qqp": None, "wnli": None,
         "qnli": ["entailment", "not_entailment"], "rte": ["entailment", "not_entailment"], "mnli": NLI, "ax": NLI}


def _name(task: str, label) -> str:
    names = NAMES.get(task)
    return names[label] if names else str(label)


def write_tsv_tree(root: Path) -> Path:
    """glue_data/ as GLUE's download script writes it; returns the folder."""
    root.mkdir(parents=True, exist_ok=True)

    def write(folder: str, name: str, lines: list[list[str]]) -> None:
        (root / folder).mkdir(exist_ok=True)
        (root / folder / name).write_text("".join("\t".join(map(str, ln)) + "\n" for ln in lines))

    for split, n, seed in (("train", TRAIN, 0), ("dev", DEV, 1)):
        f = f"{split}.tsv"
        rows = examples("cola", n, seed)
        write("CoLA", f, [["gj04", r["label"], "" if r["label"] else "*", r["a"]] for r in rows])  # no header
        rows = examples("sst2", n, seed)
        write("SST-2", f, [["sentence", "label"], *[[r["a"], r["label"]] for r in rows]])
        rows = examples("mrpc", n, seed)
        write("MRPC", f, [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                          *[[r["label"], 100 + i, 200 + i, r["a"], r["b"]] for i, r in enumerate(rows)]])
        rows = examples("stsb", n, seed)
        write("STS-B", f, [["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                            "sentence2", "score"],
                           *[[i, "main-news", "x", "2012", i, "none", "none", r["a"], r["b"], f"{r['label']:.3f}"]
                             for i, r in enumerate(rows)]])
        rows = examples("qqp", n, seed)
        lines = [[i, 2 * i, 2 * i + 1, r["a"], r["b"], r["label"]] for i, r in enumerate(rows)]
        if split == "train":  # QQP's own: a question broken over a line, its row a field short
            lines += [[900 + j, 1, 2, "a question without its pair", 0][:5] for j in range(MALFORMED_QQP)]
        write("QQP", f, [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], *lines])
        for task, folder in (("qnli", "QNLI"),):
            rows = examples(task, n, seed)
            write(folder, f, [["index", "question", "sentence", "label"],
                              *[[i, r["a"], r["b"], _name(task, r["label"])] for i, r in enumerate(rows)]])
        for task, folder in (("rte", "RTE"), ("wnli", "WNLI")):
            rows = examples(task, n, seed)
            write(folder, f, [["index", "sentence1", "sentence2", "label"],
                              *[[i, r["a"], r["b"], _name(task, r["label"])] for i, r in enumerate(rows)]])
    head = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
            "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]
    rows = examples("mnli", TRAIN, 0)
    write("MNLI", "train.tsv", [[*head, "label1", "gold_label"],
                                *[[i, i, f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", r["a"], r["b"],
                                   _name("mnli", r["label"]), _name("mnli", r["label"])] for i, r in enumerate(rows)]])
    for name, seed in (("dev_matched.tsv", 1), ("dev_mismatched.tsv", 2)):
        rows = examples("mnli", DEV, seed)
        write("MNLI", name, [[*head, *[f"label{j}" for j in range(1, 6)], "gold_label"],
                             *[[i, i, f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", r["a"], r["b"],
                                *[_name("mnli", r["label"])] * 6] for i, r in enumerate(rows)]])
    rows = examples("ax", DEV, 3)
    write("diagnostic", "diagnostic-full.tsv",
          [["Lexical Semantics", "Predicate-Argument Structure", "Logic", "Knowledge", "Domain", "Premise",
            "Hypothesis", "Label"], *[["", "", "Negation", "", "Artificial", r["a"], r["b"], _name("ax", r["label"])]
                                      for r in rows]])
    return root


HF = {"cola": (["sentence"], ["unacceptable", "acceptable"]), "sst2": (["sentence"], ["negative", "positive"]),
      "mrpc": (["sentence1", "sentence2"], ["not_equivalent", "equivalent"]), "stsb": (["sentence1", "sentence2"], None),
      "qqp": (["question1", "question2"], ["not_duplicate", "duplicate"]), "mnli": (["premise", "hypothesis"], NLI),
      "qnli": (["question", "sentence"], ["entailment", "not_entailment"]),
      "rte": (["sentence1", "sentence2"], ["entailment", "not_entailment"]),
      "wnli": (["sentence1", "sentence2"], ["not_entailment", "entailment"]), "ax": (["premise", "hypothesis"], NLI)}


def write_saved(root: Path, ax_labels: bool = True) -> Path:
    """<root>/<task>/: datasets.DatasetDict.save_to_disk of each task, as load_dataset('nyu-mll/glue', task). AX
    with its labels (diagnostic-full.tsv's, saved by a user), or with ax_labels=False hidden as HF's copy has it."""
    import datasets

    datasets.disable_progress_bars()
    for task, (columns, names) in HF.items():
        label = datasets.Value("float32") if names is None else datasets.ClassLabel(names=names)
        features = datasets.Features({**{c: datasets.Value("string") for c in columns}, "label": label,
                                      "idx": datasets.Value("int32")})
        splits = {"train": (TRAIN, 0), "validation": (DEV, 1), "test": (DEV, 4)}
        if task == "mnli":
            splits = {"train": (TRAIN, 0), "validation_matched": (DEV, 1), "validation_mismatched": (DEV, 2)}
        if task == "ax":
            splits = {"test": (DEV, 3)}
        parts = {}
        for split, (n, seed) in splits.items():
            rows = examples(task, n, seed)
            hidden = split == "test" and (task != "ax" or not ax_labels)  # GLUE hides its test labels (HF: -1)
            data = {columns[0]: [r["a"] for r in rows], "label": [-1 if hidden else r["label"] for r in rows],
                    "idx": list(range(n))}
            if len(columns) == 2:
                data[columns[1]] = [r["b"] for r in rows]
            parts[split] = datasets.Dataset.from_dict(data, features=features)
        datasets.DatasetDict(parts).save_to_disk(str(root / task))
    return root
