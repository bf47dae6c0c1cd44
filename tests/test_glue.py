"""The whole GLUE table: every task (and AX) read in both offline forms, trained with its own head and loss, scored
as GLUE scores it (checked against scipy and sklearn on the same predictions), and one sweep that writes glue.md
and glue.csv; `attnlab-compare --glue` puts such rows under each other."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import glue_mini
from attnlab.compare.glue import cell, glue_table, markdown
from attnlab.data.text.glue import GlueDataModule
from attnlab.data.text.glue_tasks import LEADERBOARD, TASKS
from attnlab.errors import UserError
from conftest import FAST, compose_cfg, run_cli, run_here

TASK_LIST = ",".join(LEADERBOARD)
TINY = ["model.init_from=null", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
        "data.tokenizer_vocab_size=100", "data.batch_size=8", "trainer=cpu", "optimizer.lr=3e-3", *FAST]


@pytest.fixture(scope="module")
def forms(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("glue")
    return {"tsv": glue_mini.write_tsv_tree(root / "glue_data"), "saved": glue_mini.write_saved(root / "saved")}


def _dm(task: str, folder: Path, tmp: Path, **kw) -> GlueDataModule:
    return GlueDataModule(task=task, local_path=str(folder), tokenizer_vocab_size=100, cache_dir=str(tmp / "cache"),
                          batch_size=8, **kw)


@pytest.mark.parametrize("task", [*LEADERBOARD])
def test_each_task_reads_the_same_from_glue_data_and_from_save_to_disk(forms, tmp_path, task):
    """Both offline forms give the same texts and labels, with the task's columns, its labels' names (or STS-B's
    scores), MNLI's two validation sets, and QQP's malformed rows skipped."""
    tsv, saved = _dm(task, forms["tsv"], tmp_path), _dm(task, forms["saved"], tmp_path)
    a, b = tsv.load_rows(), saved.load_rows()
    assert a == b
    spec = TASKS[task]
    assert len(a["train"]) == glue_mini.TRAIN and len(a["val"]) == glue_mini.DEV
    assert set(a["train"][0]) == {*spec.columns, "label"}
    expected = glue_mini.examples(task, glue_mini.TRAIN, 0)
    if spec.labels is None:  # STS-B: the score, from the last column
        assert [float(r["label"]) for r in a["train"]] == pytest.approx([e["label"] for e in expected], abs=1e-6)
    else:
        assert [r["label"] for r in a["train"]] == [spec.labels[e["label"]] for e in expected]
    assert a["train"][0][spec.columns[0]] == expected[0]["a"]
    if task == "mnli":
        assert [r[spec.columns[0]] for r in a["val_mismatched"]] == [e["a"] for e in glue_mini.examples("mnli", 16, 2)]
    tsv.setup("fit")
    info = tsv.info()
    assert info.num_classes == (1 if spec.labels is None else len(spec.labels))
    assert info.target.value == ("scores" if spec.labels is None else "classes")
    assert info.val_names == (["matched", "mismatched"] if task == "mnli" else None)
    assert len(tsv.val_dataloader()) == 2 if task == "mnli" else not isinstance(tsv.val_dataloader(), list)


def test_qqp_malformed_rows_are_counted_and_missing_files_named(forms, tmp_path, caplog):
    import shutil

    with caplog.at_level("WARNING", logger="attnlab"):
        _dm("qqp", forms["tsv"], tmp_path).load_rows()
    assert f"{glue_mini.MALFORMED_QQP} malformed row(s) skipped" in caplog.text
    broken = tmp_path / "glue_data"
    shutil.copytree(forms["tsv"] / "MNLI", broken / "MNLI")
    (broken / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(UserError, match=r"MNLI has no dev_mismatched.tsv: .*download_glue_data.py"):
        _dm("mnli", broken, tmp_path).load_rows()
    with pytest.raises(UserError, match=r"holds no GLUE rte: .*save_to_disk.*glue_data/ tree of GLUE's download"):
        _dm("rte", tmp_path / "nothing", tmp_path).load_rows()
    hidden = glue_mini.write_saved(tmp_path / "hf", ax_labels=False)
    with pytest.raises(UserError, match="labels are hidden .* diagnostic-full.tsv"):  # HF's AX: -1 labels
        _dm("ax", hidden, tmp_path).load_rows()
    assert _dm("ax", forms["saved"], tmp_path).load_rows() == _dm("ax", forms["tsv"], tmp_path).load_rows()
    ax = _dm("ax", forms["tsv"], tmp_path)
    with pytest.raises(UserError, match=r"no training text .* tokenizer of the MNLI checkpoint.*\+data.task=ax"):
        ax.setup("fit")
    mnli = _dm("mnli", forms["tsv"], tmp_path)
    mnli.setup("fit")
    ax.use_tokenizer(mnli.info().tokenizer)
    ax.setup("fit")
    assert ax.info().class_names == mnli.info().class_names and len(ax.test_set) == glue_mini.DEV
    with pytest.raises(UserError, match=r"evaluation only: train on MNLI.*\+data.task=ax"):
        ax.train_dataloader()


def test_a_network_that_cannot_regress_and_a_monitor_never_logged_are_refused():
    from attnlab.nn.registry import register_network
    from attnlab.tasks.text_classification import TextClassifier

    @register_network("classes_only_test_net")
    class ClassesOnly(torch.nn.Module):
        def __init__(self, vocab_size: int = 10, max_length: int = 8, num_classes: int = 2):
            super().__init__()
            self.head = torch.nn.Linear(4, num_classes)

    with pytest.raises(UserError, match=r"scores to regress .* model.net=classes_only_test_net predicts classes only"):
        TextClassifier(vocab_size=10, max_length=8, num_classes=1, net="classes_only_test_net", target="scores",
                       monitor="val/pearson")
    with pytest.raises(UserError, match=r"model.monitor=val/acc is not a metric of this task, which logs val/loss, "
                                        "val/pearson, val/spearman"):
        TextClassifier(vocab_size=10, max_length=8, num_classes=1, n_layer=1, n_head=2, n_embd=8, target="scores",
                       monitor="val/acc")


def _write_run(folder: Path, task: str, metrics: dict, **config) -> None:
    folder.mkdir(parents=True)
    cfg = {"data": {"_target_": "attnlab.data.text.glue.GlueDataModule", "task": task},
           "model": {"_target_": "attnlab.tasks.text_classification.TextClassifier"}} | config
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / "metrics.json").write_text(json.dumps(metrics))


def test_the_table_and_score_match_a_hand_computed_case(tmp_path, capsys):
    """Cells as the leaderboard prints them, the best of several learning rates by the ranked metric's best
    validation value, the score as the mean of the nine task means (WNLI counted, AX apart), seeds as mean ± std."""
    from attnlab.compare.cli import main

    test = {"cola": {"mcc": .521}, "sst2": {"acc": .935}, "mrpc": {"f1": .889, "acc": .848},
            "stsb": {"pearson": .871, "spearman": .865}, "qqp": {"f1": .712, "acc": .893},
            "mnli": {"acc_matched": .846, "acc_mismatched": .834}, "qnli": {"acc": .905}, "rte": {"acc": .664},
            "wnli": {"acc": .651}, "ax": {"mcc": .349}}
    sweep = tmp_path / "bert_base"
    for i, (task, ms) in enumerate(test.items()):
        first = TASKS[task].metrics[0]
        _write_run(sweep / str(i), task, {f"test/{k}": v for k, v in ms.items()} | {f"val/{first}_best": .9},
                   optimizer={"lr": 2e-5})
    # a second learning rate on RTE: worse on validation, so not chosen, though better on test
    _write_run(sweep / "99", "rte", {"test/acc": .99, "val/acc_best": .5}, optimizer={"lr": 5e-5})
    (row,) = glue_table([str(sweep)])
    hand = statistics.fmean([52.1, 93.5, (88.9 + 84.8) / 2, (87.1 + 86.5) / 2, (71.2 + 89.3) / 2, (84.6 + 83.4) / 2,
                             90.5, 66.4, 65.1])
    assert row.score() == pytest.approx(hand)
    md = markdown([row])
    assert ("| | Score | CoLA | SST-2 | MRPC | STS-B | QQP | MNLI-m/mm | QNLI | RTE | WNLI | AX |" in md)
    assert (f"| bert_base | {hand:.1f} | 52.1 | 93.5 | 88.9/84.8 | 87.1/86.5 | 71.2/89.3 | 84.6/83.4 | 90.5 | 66.4 | "
            "65.1 | 34.9 |") in md
    # seeds: two of CoLA and SST-2 alone: mean ± std, over 2 of 9 tasks
    seeds = tmp_path / "mini"
    for seed, (mcc, acc) in enumerate([(.30, .80), (.40, .84)]):
        _write_run(seeds / f"c{seed}", "cola", {"test/mcc": mcc, "val/mcc_best": mcc}, seed=seed)
        _write_run(seeds / f"s{seed}", "sst2", {"test/acc": acc, "val/acc_best": acc}, seed=seed)
    assert main(["--glue", str(seeds), str(sweep), "--seeds"]) == 0
    out = capsys.readouterr().out
    spread = statistics.stdev([(30 + 80) / 2, (40 + 84) / 2])
    assert f"| mini | {(35 + 82) / 2:.1f}±{spread:.1f} (2 of 9 tasks) | 35.0±7.1 | 82.0±2.8 | – |" in out
    assert f"| bert_base | {hand:.1f} | 52.1 |" in out
    _write_run(tmp_path / "cifar" / "0", "cola", {"test/acc": .9},
               data={"_target_": "attnlab.data.images.cifar.CIFAR10DataModule"})
    with pytest.raises(SystemExit) as exit_:
        main(["--glue", str(tmp_path / "cifar")])
    assert exit_.value.code == 2 and "holds no finished run of data=glue" in capsys.readouterr().err


def test_seeds_are_grouped_by_setting_in_a_sweep_copied_off_its_cluster(tmp_path):
    """A run's config.yaml is resolved: data.seed follows seed, and the run's own folder (as it was on the cluster it
    ran on) is in trainer.default_root_dir and the checkpoint folder. Neither makes each seed a setting of its own:
    the best setting's seeds give mean ± std, not the luckiest seed."""
    sweep = tmp_path / "copied"
    for i, (lr, seed, acc) in enumerate([(2e-5, 0, .90), (2e-5, 1, .80), (5e-5, 0, .86), (5e-5, 1, .86)]):
        ran_in = f"/cluster/logs/glue/multiruns/{i}"
        _write_run(sweep / str(i), "sst2", {"test/acc": acc, "val/acc_best": acc}, seed=seed, optimizer={"lr": lr},
                   data={"_target_": "attnlab.data.text.glue.GlueDataModule", "task": "sst2", "seed": seed},
                   paths={"output_dir": ran_in}, trainer={"default_root_dir": ran_in},
                   callbacks={"model_checkpoint": {"dirpath": f"{ran_in}/checkpoints"}})
    (row,) = glue_table([str(sweep)], seeds=True)
    assert sorted(row.cells["sst2"]) == [[86.0], [86.0]]
    assert cell(row, "sst2") == "86.0±0.0"


def _predictions(model, dm) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    loaders = dm.test_dataloader()
    for loader in loaders if isinstance(loaders, list) else [loaders]:
        preds, ys = [], []
        with torch.no_grad():
            for batch in loader:
                preds.append(model.predictions(model._logits(batch).float()))
                ys.append(batch["labels"])
        out.append((torch.cat(preds).numpy(), torch.cat(ys).numpy()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("form", ["tsv", "saved"])
def test_one_sweep_runs_every_task_and_writes_the_glue_table(forms, tmp_path, form):
    """`python train.py -m experiment=bert_glue data.task=<the nine>`, a new process, on the miniature sets: each
    run reports its task's leaderboard metrics, matching scipy's and sklearn's on the same predictions (to 1e-6, and
    STS-B's correlations to 1e-4), and the sweep's glue.md and glue.csv hold the row computed from the runs' own
    metrics.json. Then STS-B's regression head evaluates, predicts and exports, and an MNLI checkpoint is evaluated
    on AX."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    from attnlab.cli import builders
    from attnlab.checkpoints.resume import read_run_metadata

    sweep = tmp_path / "sweep"
    proc = run_cli("train.py", "-m", "experiment=bert_glue", f"data.task={TASK_LIST}", f"data.local_path={forms[form]}",
                   *TINY, "trainer.max_epochs=2", f"hydra.sweep.dir={sweep}",
                   env={"ATTNLAB_LOG_DIR": str(tmp_path / "logs")})
    assert proc.returncode == 0, proc.stdout[-4000:]
    runs = {}
    for folder in sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.json").is_file()):
        task = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text())[1].split("=")[1]
        runs[task] = folder
    assert sorted(runs) == sorted(LEADERBOARD)
    cells = {}
    for task, folder in runs.items():
        metrics = json.loads((folder / "metrics.json").read_text())
        spec = TASKS[task]
        assert {f"test/{m}" for m in spec.metrics} <= set(metrics), (task, sorted(metrics))
        assert f"val/{spec.metrics[0]}_best" in metrics  # the ranked metric is the monitor
        cells[task] = [100 * metrics[f"test/{m}"] for m in spec.metrics]
        # the same predictions scored by scipy / sklearn: the best checkpoint, as the test pass read it
        ckpt = next((folder / "checkpoints").glob("epoch_*.ckpt"))
        model = builders.load_task(ckpt, read_run_metadata(ckpt)).eval()
        dm = _dm(task, forms[form], tmp_path)
        dm.use_tokenizer(model.tokenizer_json)
        dm.setup("fit")
        for (pred, y), suffix in zip(_predictions(model, dm), ["_matched", "_mismatched"] if task == "mnli" else [""]):
            if task == "stsb":
                independent = {"pearson": pearsonr(pred, y)[0], "spearman": spearmanr(pred, y)[0]}
            else:
                independent = {"acc": accuracy_score(y, pred), "mcc": matthews_corrcoef(y, pred)}
            if spec.labels is not None and len(spec.labels) == 2:
                independent["f1"] = f1_score(y, pred)
            # counts agree exactly; the correlations of a barely trained head's nearly equal STS-B scores move with
            # float32 rounding (Lightning's test loop against this loop over the same batches)
            tolerance = 1e-4 if task == "stsb" else 1e-6
            for name, value in independent.items():
                assert metrics[f"test/{name}{suffix}"] == pytest.approx(value, abs=tolerance), (task, name)
    score = statistics.fmean(statistics.fmean(cells[t]) for t in LEADERBOARD)
    with open(sweep / "glue.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["score"]) == pytest.approx(score, abs=0.006) and row["tasks"] == "9"
    assert row["mrpc"] == "/".join(f"{v:.1f}" for v in cells["mrpc"])
    assert f"| sweep | {score:.1f} |" in (sweep / "glue.md").read_text()
    # AX: an MNLI checkpoint on the diagnostic, scored by its Matthews correlation
    mnli = next((runs["mnli"] / "checkpoints").glob("epoch_*.ckpt"))
    proc = run_here("eval.py", f"ckpt_path={mnli}", "+data.task=ax", f"hydra.run.dir={tmp_path}/ax",
                    env={"ATTNLAB_LOG_DIR": str(tmp_path / "logs")})
    assert proc.returncode == 0, proc.stdout[-3000:]
    evaluated = json.loads((tmp_path / "ax" / "metrics.json").read_text())
    model = builders.load_task(mnli, read_run_metadata(mnli)).eval()
    ax = _dm("ax", forms[form], tmp_path)
    ax.use_tokenizer(model.tokenizer_json)
    ax.setup("fit")
    model.check_data(ax.info())  # scored on AX's one set, not MNLI's two
    ((pred, y),) = _predictions(model, ax)
    assert evaluated["test/mcc"] == pytest.approx(matthews_corrcoef(y, pred), abs=1e-6)
    assert evaluated["test/acc"] == pytest.approx(accuracy_score(y, pred), abs=1e-6)
    if form == "saved":
        return
    # STS-B's regression head: eval, predict and export like any other task
    stsb = next((runs["stsb"] / "checkpoints").glob("epoch_*.ckpt"))
    env = {"ATTNLAB_LOG_DIR": str(tmp_path / "logs")}
    proc = run_here("eval.py", f"ckpt_path={stsb}", f"hydra.run.dir={tmp_path}/eval", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    evaluated = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    trained = json.loads((runs["stsb"] / "metrics.json").read_text())
    assert evaluated["test/pearson"] == pytest.approx(trained["test/pearson"], abs=1e-5)
    proc = run_here("predict.py", f"ckpt_path={stsb}", "text='a sim sim dog\tthe sim sim cat'",
                    f"hydra.run.dir={tmp_path}/predict", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.endswith("a sim sim dog\tthe sim sim cat"))
    float(line.split(":")[0])  # a score, not a class name
    proc = run_here("export.py", f"ckpt_path={stsb}", f"hydra.run.dir={tmp_path}/export", env=env)
    assert proc.returncode == 0 and (tmp_path / "export" / "model.safetensors").is_file(), proc.stdout[-3000:]


def test_stsb_trains_in_process_as_a_regression(forms, tmp_path):
    """The inner loop's STS-B: one output, MSE, Pearson and Spearman, ranked by Pearson."""
    from attnlab.cli.train import train

    cfg = compose_cfg(["experiment=bert_glue", "data.task=stsb", f"data.local_path={forms['tsv']}", *TINY,
                       "trainer.max_steps=6", "logger=csv"], tmp_path / "run")
    assert cfg.model.monitor == "val/pearson" and cfg.callbacks.model_checkpoint.monitor == "val/pearson"
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert {"test/pearson", "test/spearman", "val/pearson_best"} <= set(metrics) and "test/acc" not in metrics
    assert (tmp_path / "run" / "media" / "test_errors.csv").is_file()
