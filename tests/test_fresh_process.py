"""Every task's README recipe as a user runs it: `train.py` as a new `python` process with empty caches, a few steps
through fit, validation and test with the task's media, then `eval.py`, `predict.py` and `export.py` on its
checkpoint. Each entry point runs as a new process for one task (NEW_PROCESS: an image, a text and a translation
task) and in the test's process for the others; each ends with status 0 and no traceback in its output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import run_cli, run_here, wandb_offline

# a few steps of each run, its validation and test with their media
BUDGET = ["trainer.max_steps=3", "trainer.max_epochs=1", "trainer.limit_train_batches=3",
          "trainer.limit_val_batches=1", "trainer.limit_test_batches=2", "trainer.num_sanity_val_steps=0",
          "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=1", "data.num_workers=0",
          "logger=many"]  # CSV, TensorBoard and W&B (offline): the media each logger is sent
IMAGE = "image.png"  # an image of the data, written by the test for predict.py

# task: (train arguments, predict arguments, media the run writes: glob patterns under its run folder)
WANDB = "wandb/offline-run-*/files/media"
TASKS = {
    "image classification": (["data.batch_size=16"], [f"input={IMAGE}"], [f"{WANDB}/table/val/predictions*"]),
    "mae pretraining": (["experiment=mae_pretrain_cifar10", "data.batch_size=8"], [f"input={IMAGE}"],
                        ["media/val_*.png", f"{WANDB}/images/**/*"]),
    "mae fine-tuning": (["experiment=mae_finetune_cifar10", "data.batch_size=8"], [f"input={IMAGE}"],
                        [f"{WANDB}/table/val/predictions*"]),
    "gpt": (["experiment=gpt_shakespeare_char_cpu", "data.batch_size=4", "model.sample_every=1"],
            ["prompt=ROMEO:", "max_new_tokens=8"], [f"{WANDB}/table/**/*"]),
    "bert mlm": (["experiment=bert_sst2_mlm", "data.batch_size=8"], ["text=a [MASK] movie"], [f"{WANDB}/table/**/*"]),
    "bert fine-tuning": (["experiment=bert_sst2_finetune", "data.batch_size=8"], ["text=a gripping , funny movie"],
                         ["media/test_confusion.png", f"{WANDB}/images/**/*"]),
    "bert from scratch": (["model=bert_classifier", "data=sst2", "data.batch_size=8"],
                          ["text=a gripping , funny movie"], ["media/test_confusion.png"]),
    "translation transformer": (["experiment=mt_transformer", "data.batch_size=8"], ["text=Ein Mann im Park ."],
                                [f"{WANDB}/table/**/*"]),
    "translation rnn": (["experiment=mt_bahdanau", "data.batch_size=8"], ["text=Ein Mann im Park ."],
                        ["alignments/*.png", f"{WANDB}/images/**/*"]),
    "segmentation": (["experiment=unet_membrane", "data.batch_size=2", "data.image_size=64",
                      "data.samples_per_epoch=6"], [f"input={IMAGE}"], ["media/val_*.png", f"{WANDB}/images/**/*"]),
}
# the runs a task's recipe starts from (model.init_from reads the newest run of that task)
FIRST = {"mae fine-tuning": "mae pretraining", "bert fine-tuning": "bert mlm"}
# the task whose checkpoint each entry point reads in a new process of its own
NEW_PROCESS = {"eval.py": "translation transformer", "predict.py": "gpt", "export.py": "image classification"}


def fresh_env(root: Path) -> dict[str, str]:
    """A new user's process: empty compile, data and tokenizer caches."""
    return wandb_offline(root) | {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "ATTNLAB_CACHE_DIR": str(root / "cache"), "ATTNLAB_LOG_DIR": str(root / "logs"),
            "ATTNLAB_EXIT_GRACE_S": "600"}


def check_ran(out, what: str) -> None:
    assert out.returncode == 0, (what, out.returncode, out.stdout[-4000:])
    assert "Traceback" not in out.stdout and "still held" not in out.stdout, (what, out.stdout[-4000:])


def train_fresh(task: str, root: Path, data: Path) -> Path:
    """The task's run, in a new process: -> its run folder."""
    args = TASKS[task][0]
    env = fresh_env(root)
    out = run_cli("train.py", *args, *BUDGET, env=env, data_dir=data, timeout=600)
    check_ran(out, f"train.py {' '.join(args)}")
    line = next(line for line in out.stdout.splitlines() if "run directory:" in line)
    run_dir = Path(line.split("run directory:", 1)[1].strip())
    assert (run_dir / "metrics.json").is_file(), out.stdout[-3000:]
    flops = re.search(r"Total FLOPs: (\S+)", out.stdout)  # the model summary's count: the task's, never Lightning's 0
    assert flops and flops.group(1) != "0", (task, flops and flops.group(0))
    return run_dir


def image_of(data: Path, task: str, folder: Path) -> Path:
    """An image of the task's data, for predict.py."""
    import numpy as np
    from PIL import Image

    if task == "segmentation":  # a copy: predict.py writes <name>_mask.png beside it
        import shutil

        return Path(shutil.copy(next((data / "isbi2012_em_membrane" / "image").glob("*.png")), folder / IMAGE))
    if task == "image classification":
        from attnlab.data.images.digits import load_digits

        pixels = (load_digits()[0][0] * 255 / 16).astype(np.uint8)
        path = folder / IMAGE
        Image.fromarray(pixels).save(path)
        return path
    path = folder / IMAGE
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_a_task_from_the_readme_runs_in_new_processes_through_eval_predict_and_export(task, tmp_path, small_data):
    if task in FIRST:  # new itself in its own task's test
        train_fresh(FIRST[task], tmp_path, small_data)
    run_dir = train_fresh(task, tmp_path, small_data)
    for pattern in TASKS[task][2]:
        assert any(p.is_file() and p.stat().st_size > 0 for p in run_dir.glob(pattern)), \
            (task, pattern, sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()))
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file(), sorted((run_dir / "checkpoints").iterdir())
    predict_args = [a.replace(IMAGE, str(image_of(small_data, task, tmp_path))) for a in TASKS[task][1]]
    for script, *args in (("eval.py", f"ckpt_path={ckpt}", "trainer.limit_test_batches=2"),
                          ("predict.py", f"ckpt_path={ckpt}", *predict_args),
                          ("export.py", f"ckpt_path={ckpt}", "format=safetensors")):
        env = fresh_env(tmp_path)
        run = run_cli if NEW_PROCESS[script] == task else run_here
        out = run(script, *args, env=env, data_dir=small_data, timeout=600)
        check_ran(out, f"{script} {' '.join(args)}")
    assert any((tmp_path / "logs").rglob("model.safetensors"))
