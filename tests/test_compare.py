"""attnlab-compare: a 2x2 grid (seed x lr) on digits, compared, grouped by seed, reported as HTML (and looked at in
headless Chromium where it is installed), and the refusals of bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from attnlab.compare import compare, main, show_diff
from conftest import ROOT, run_here

QUICK = ["trainer.max_epochs=2", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
         "trainer.limit_test_batches=2", "extras.print_config=false", "callbacks.progress_bar=null"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """logs/train/multiruns/<time>/{0,1,2,3}: seed=1,2 x optimizer.lr=1e-3,3e-3, and the multirun's output."""
    tmp = tmp_path_factory.mktemp("grid")
    env = {"ATTNLAB_LOG_DIR": str(tmp / "logs"), "ATTNLAB_CACHE_DIR": str(tmp / "cache")}
    out = run_here("train.py", "-m", "data=digits", "seed=1,2", "optimizer.lr=1e-3,3e-3", *QUICK, env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    (sweep,) = (tmp / "logs" / "train" / "multiruns").iterdir()
    return sweep, out.stdout


@pytest.mark.slow
def test_multirun_end_prints_the_seed_grouping_next_to_results_csv(grid):
    sweep, stdout = grid
    assert (sweep / "results.csv").is_file()
    assert "grouped by seed" in stdout and "±" in stdout and "optimizer.lr" in stdout


@pytest.mark.slow
def test_table_agrees_with_results_csv_and_groups_mean_std(grid, tmp_path):
    sweep, _ = grid
    (df,) = compare([str(sweep)], sort="val/acc_best")
    assert len(df) == 4 and {"seed", "optimizer.lr"} <= set(df.columns)
    assert not any(c.startswith(("paths.", "callbacks.model_checkpoint")) for c in df.columns)  # places, not settings
    results = pd.read_csv(sweep / "results.csv")
    by_dir = {str(p).rsplit("/", 1)[-1]: v for p, v in zip(results["run_dir"], results["val/acc_best"])}
    for _, row in df.iterrows():
        assert row["val/acc_best"] == pytest.approx(by_dir[row["run"].rsplit("/", 1)[-1]])
    assert list(df["val/acc_best"]) == sorted(df["val/acc_best"], reverse=True)   # best first

    (groups,) = compare([str(sweep)], group_by="seed", metrics=["val/acc_best"])
    assert len(groups) == 2 and list(groups["n"]) == [2, 2]
    for _, g in groups.iterrows():
        mean, std, n = g["val/acc_best"]
        members = [by_dir[name.strip()] for name in g["runs"].split(",")]
        assert n == 2 and mean == pytest.approx(sum(members) / 2)
        assert std == pytest.approx(pd.Series(members).std())   # the sample standard deviation, as pandas


@pytest.mark.slow
def test_report_shows_the_table_and_curves(grid, tmp_path):
    sweep, _ = grid
    report = tmp_path / "report.html"
    compare([str(sweep)], group_by="seed", metrics=["val/acc_best", "val/loss"], report=report)
    page = report.read_text()
    assert "<table>" in page and page.count("data:image/png;base64,") >= 2 and "Config keys that differ" in page
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("no Chromium found: the report's screenshot is not taken (apt-get install chromium)")
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1300,1400", report.as_uri()],
                   capture_output=True, timeout=120)
    from PIL import Image
    import numpy as np

    pixels = np.asarray(Image.open(shot).convert("L"))
    assert pixels.shape == (1400, 1300)
    table_band, plot_band = pixels[100:250], pixels[250:900]
    assert (table_band < 128).mean() > 0.005            # the table's text
    assert (plot_band < 250).mean() > 0.05              # the plots' lines, bands and axes


@pytest.mark.slow
def test_unfinished_runs_other_tasks_and_diff(grid, tmp_path, capsys):
    sweep, _ = grid
    runs = tmp_path / "runs"
    shutil.copytree(sweep / "0", runs / "a")
    shutil.copytree(sweep / "3", runs / "b")
    (runs / "b" / "metrics.json").unlink()                                   # stopped before the end
    shutil.copytree(sweep / "1", runs / "other")
    cfg = yaml.safe_load((runs / "other" / "config.yaml").read_text())
    cfg["model"]["_target_"] = "mypkg.tasks.MyTask"
    (runs / "other" / "config.yaml").write_text(yaml.safe_dump(cfg))
    frames = compare([str(runs / "*")])
    assert len(frames) == 2                                                  # one table per task
    main_table = next(f for f in frames if len(f) == 2)
    assert main_table.set_index("run").loc["b", "status"].startswith("unfinished (step ")
    rows = show_diff(str(sweep / "0"), str(sweep / "3"))
    assert {k for k, _, _ in rows} >= {"seed", "optimizer.lr"}
    assert dict((k, (a, b)) for k, a, b in rows)["optimizer.lr"] == (0.001, 0.003)


@pytest.mark.parametrize("args, message", [
    (["{empty}"], "no runs found in .*: a run is a directory with the config.yaml"),
    (["{sweep}", "--group-by", "model.no_such_key"], "--group-by model.no_such_key: no run's config has the key"),
    (["{sweep}", "--sort", "val/nope"], "--sort val/nope: not a column of the table"),
    (["{sweep}", "--metrics", "val/nope"], "--metrics val/nope: no run reports it"),
])
@pytest.mark.slow
def test_bad_input_is_one_paragraph(grid, tmp_path, capsys, args, message):
    import re

    sweep, _ = grid
    (tmp_path / "empty").mkdir()
    argv = [a.format(empty=tmp_path / "empty", sweep=sweep) for a in args]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and re.search(message, err) and "Traceback" not in err


@pytest.mark.slow
def test_python_m_attnlab_compare(grid):
    sweep, _ = grid
    out = subprocess.run([sys.executable, "-m", "attnlab.compare", str(sweep), "--metrics", "val/acc_best"],
                      cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ImageClassifier: 4 run(s)" in out.stdout, out.stderr[-2000:]
    assert json.loads((sweep / "0" / "metrics.json").read_text())


def _made_up_runs(root) -> None:
    """Three run folders as train.py leaves them (config.yaml, metrics.json or only csv/metrics.csv), differing in six
    settings, with five metrics: too wide for 80 columns."""
    for i, (name, finished) in enumerate((("run_good", True), ("run_bad", True), ("run_stopped", False))):
        run = root / name
        (run / "csv").mkdir(parents=True)
        cfg = {"model": {"_target_": "attnlab.tasks.classification.ImageClassifier", "n_layer": i + 2,
                         "dropout": i / 10}, "optimizer": {"lr": 10.0 ** -(i + 2), "weight_decay": i / 100},
               "seed": i, "data": {"batch_size": 32 * (i + 1)}}
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
        (run / "csv" / "metrics.csv").write_text("step,val/acc,val/loss\n12,0.5,1.2\n")
        if finished:
            (run / "metrics.json").write_text(json.dumps({"val/acc": 0.9 - i / 10, "val/acc_best": 0.91 - i / 10,
                                                          "val/loss": 0.3 + i, "test/acc": 0.88, "test/loss": 0.35}))


@pytest.mark.parametrize("group_by", [None, "seed"])
def test_an_80_column_or_piped_output_keeps_run_names_statuses_and_headers_whole(tmp_path, group_by):
    import os
    import re

    _made_up_runs(tmp_path)
    out = subprocess.run([sys.executable, "-m", "attnlab.compare", str(tmp_path / "*"),
                       *(["--group-by", group_by] if group_by else [])],
                      cwd=ROOT, env=os.environ | {"COLUMNS": "80"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, out.stdout
    cells = [c.strip() for line in lines for c in re.split("[│┃]", line)]
    parts = out.stdout.count("ImageClassifier: 3 run(s)")
    for name in ("run_good", "run_bad", "run_stopped"):     # each part names every row's run, whole
        assert cells.count(name) == parts, out.stdout
    assert parts > 1, out.stdout                            # the columns that do not fit go to further parts
    for status in ("finished", "unfinished (step 12)" if not group_by else "1 unfinished"):
        assert status in cells, out.stdout
    for header in ("optimizer.weight_decay", "model.n_layer", "val/acc_best", "test/loss", "val/loss"):
        assert header in cells, out.stdout
    assert ("0.9100" if not group_by else "0.9100 ± 0.0000") in cells, out.stdout


def test_a_terminal_too_narrow_for_run_and_status_lists_each_run_sideways(tmp_path):
    import io

    from rich.console import Console

    _made_up_runs(tmp_path)
    screen = io.StringIO()
    compare([str(tmp_path / "*")], console=Console(file=screen, width=30))
    lines = screen.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 30
    assert "run_stopped" in lines and "  status: unfinished (step 12)" in lines and "  val/acc_best: 0.9100" in lines


# ---- k-fold cross-validation

def test_folds_partition_train_and_val_stratified_and_leave_test_out(tmp_path):
    from attnlab.data.images.digits import DigitsDataModule

    sets = []
    for fold in range(3):
        dm = DigitsDataModule(folds=3, fold=fold, seed=7, augment=None)
        dm.setup("fit")
        sets.append(dm)
    vals = [sets[i].val_set.tensors[1] for i in range(3)]
    n_pool = len(sets[0].train_set) + len(sets[0].val_set)
    assert sum(len(v) for v in vals) == n_pool                             # the folds partition train + val
    for v in vals:                                                        # stratified: each class in each fold
        assert set(v.tolist()) == set(range(10))
    import torch

    for s in sets[1:]:                                                    # the test split: the same, outside
        assert torch.equal(s.test_set.tensors[0], sets[0].test_set.tensors[0])


def _image_tree(root, layout: str) -> None:
    """3 classes x 12 tiny PNGs: flat (root/<class>/), or split into train/ and val/ (and test/) folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("cat", "dog", "owl"):
        for i in range(12):
            split = {"flat": "", "train_val": "train" if i < 9 else "val",
                     "train_val_test": "train" if i < 6 else "val" if i < 9 else "test"}[layout]
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(d / f"{i}.png")


@pytest.mark.parametrize("layout", ["flat", "train_val", "train_val_test"])
def test_image_folds_partition_train_and_val_and_leave_test_out(tmp_path, layout):
    from attnlab.data.images.imagefolder import ImageFolderDataModule

    _image_tree(tmp_path, layout)

    def paths(ds) -> list[str]:
        if hasattr(ds, "indices"):
            return [ds.base.samples[i][0] for i in ds.indices]
        return [p for p, _ in ds.samples]

    runs = []
    for fold in range(3):
        dm = ImageFolderDataModule(root=str(tmp_path), folds=3, fold=fold, seed=7, image_size=8, batch_size=4,
                                   augment=None, test_fraction=0.25)
        dm.setup("fit")
        runs.append((paths(dm.train_set), paths(dm.val_set), paths(dm.test_set)))
    pool = set(runs[0][0]) | set(runs[0][1])
    assert sorted(v for _, val, _ in runs for v in val) == sorted(pool)   # the folds partition train + val
    for train, val, test in runs:
        assert not set(train) & set(val) and set(train) | set(val) == pool
        assert {p.split("/")[-2] for p in val} == {"cat", "dog", "owl"}   # stratified
        assert test == runs[0][2] and not set(test) & pool                # the test images: the same, outside
    assert len(pool) + len(runs[0][2]) == 36


@pytest.mark.parametrize("folds, fold, message", [
    (5, 5, r"data.fold=5 with data.folds=5: the folds are numbered 0 to 4.*data.fold='range\(5\)'"),
    (1, 0, r"data.folds=1: cross-validation needs at least 2 folds"),
    (300, 0, r"data.folds=300: class \S+ has \d+ example\(s\) .* fewer than the folds"),
])
def test_bad_folds_are_refused(small_data, tmp_path, folds, fold, message):
    from attnlab.data.text.classification import TextClassificationDataModule
    from attnlab.errors import UserError

    dm = TextClassificationDataModule(root=str(small_data / "sst2"), folds=folds, fold=fold,
                                      cache_dir=str(tmp_path / "cache"), tokenizer_vocab_size=200)
    with pytest.raises(UserError, match=message):
        dm.setup("fit")


@pytest.mark.slow
def test_fold_multirun_prints_the_mean_over_folds(small_data, tmp_path):
    env = {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_CACHE_DIR": str(tmp_path / "cache")}
    out = run_here("train.py", "-m", "data=digits", "data.folds=3", "data.fold=range(3)", *QUICK, env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "grouped by data.fold" in out.stdout and "0, 1, 2" in out.stdout


@pytest.mark.slow
def test_damaged_run_folders_are_named_and_the_others_compared(grid, tmp_path, caplog):
    sweep, _ = grid
    runs = tmp_path / "runs"
    for name, job in (("good", "0"), ("empty_metrics", "1"), ("bad_config", "2"), ("bad_curves", "3")):
        shutil.copytree(sweep / job, runs / name)
    (runs / "empty_metrics" / "metrics.json").write_text("")               # a full disk at the end of a run
    (runs / "bad_config" / "config.yaml").write_text("model: [unclosed\n")   # cut short
    (runs / "bad_curves" / "csv" / "metrics.csv").write_bytes(b'"step,\x00\x00\n"1,')
    with caplog.at_level("WARNING", logger="attnlab"):
        (table,) = compare([str(runs / "*")])
    status = table.set_index("run")["status"]
    assert sorted(status.index) == ["bad_curves", "empty_metrics", "good"] and status["good"] == "finished"
    assert status["empty_metrics"] == "damaged: metrics.json unreadable"
    assert f"left out {runs / 'bad_config'}: its config.yaml cannot be read" in caplog.text
    (runs / "good" / "config.yaml").write_text("")
    for name in ("empty_metrics", "bad_curves"):
        shutil.rmtree(runs / name)
    with pytest.raises(Exception, match="no run in .* can be read: .*bad_config: its config.yaml cannot be read"):
        compare([str(runs / "*")])


@pytest.mark.slow
def test_every_run_records_its_lineage_and_compare_shows_where_two_differ(grid, tmp_path, capsys):
    import torch

    sweep, _ = grid
    record = json.loads((sweep / "0" / "lineage.json").read_text())
    assert record["status"] == "finished" and record["ended"] >= record["started"]
    assert record["command"].startswith("train.py data=digits seed=1 optimizer.lr=0.001")  # this job alone
    assert record["packages"]["torch"] == torch.__version__.split("+")[0] and record["python"] == sys.version.split()[0]
    assert record["accelerator"]["cpu_count"] >= 1 and record["host"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's fresh clone is one): the commit, and the uncommitted changes
        assert record["git"]["commit"] == head.stdout.strip()
        assert record["git"]["dirty"] == (sweep / "0" / "lineage.diff").exists() or record["git"]["untracked"]
    ckpt = torch.load(sweep / "0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["attnlab"]["lineage"]["started"] == record["started"]  # the checkpoint alone says it too

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(sweep / "0", a)
    shutil.copytree(sweep / "1", b)
    other = json.loads((b / "lineage.json").read_text())
    other["packages"]["torch"] = "9.9.9"
    other["accelerator"]["gpus"] = ["NVIDIA H100 80GB HBM3"]
    (b / "lineage.json").write_text(json.dumps(other))
    rows = dict((k, (va, vb)) for k, va, vb in show_diff(str(a), str(b)))
    assert rows["lineage.packages.torch"] == (record["packages"]["torch"], "9.9.9")
    assert rows["lineage.accelerator.gpus"][1] == "['NVIDIA H100 80GB HBM3']"
    assert "lineage that differs" in capsys.readouterr().out
    report = tmp_path / "report.html"
    compare([str(a), str(b)], report=report)
    page = report.read_text()
    assert "<h3>Lineage</h3>" in page and "9.9.9" in page and "packages.torch" in page
