"""Every Lightning and torchmetrics internal attnlab uses (attnlab/compat/) exists in the installed versions: a
release that moves one fails here, by name. What each does for a run is tested through the runs (resume, checkpoints,
logging, the memory estimate)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

import attnlab
import attnlab.compat as compat

COMPAT = Path(compat.__file__).parent  # the package: the one door


def test_the_internals_compat_uses_exist():
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert isinstance(type(trainer._logger_connector).should_update_logs, property)
    assert hasattr(trainer._accelerator_connector, "use_distributed_sampler")
    loop = trainer.fit_loop
    for name in ("_combined_loader_states_to_load", "_combined_loader", "_data_fetcher"):
        assert hasattr(loop, name), name
    assert callable(loop.epoch_loop._should_check_val_fx)
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    assert callable(CombinedLoader._load_state_dicts)
    for name in ("_monitor_candidates", "_should_skip_saving_checkpoint", "_save_last_checkpoint",
                 "_should_save_on_train_epoch_end", "_save_topk_checkpoint", "_link_checkpoint", "_remove_checkpoint",
                 "_save_checkpoint", "_should_remove_checkpoint", "file_exists", "format_checkpoint_name"):
        assert callable(getattr(ModelCheckpoint, name)), name
    callback = ModelCheckpoint()
    for name in ("_every_n_train_steps", "_last_checkpoint_saved", "_last_global_step_saved", "_enable_version_counter", "CHECKPOINT_NAME_LAST",
                 "STARTING_VERSION", "last_model_path"):
        assert hasattr(callback, name), name
    assert compat.logs_this_step(trainer) in (True, False)
    # redo_interrupted_validation: the validation loop's progress in a checkpoint, and Lightning's reading of it
    checkpoint = {"loops": {"fit_loop": loop.state_dict()}}
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
    assert set(progress["total"]) == set(progress["current"]) == {"ready", "started", "processed", "completed"}
    compat.redo_interrupted_validation(checkpoint)
    val_loop = loop.epoch_loop.val_loop
    val_loop.batch_progress.load_state_dict(progress)
    val_loop.restarting = True
    val_loop.update_restart_stage()
    assert val_loop.restarted_mid_evaluation
    assert not trainer.received_sigterm
    compat.stop_after_this_step(trainer)
    assert trainer.received_sigterm


def test_the_torchmetrics_internals_compat_uses_exist():
    import torch
    from torchmetrics import MeanMetric

    metric = MeanMetric()
    assert set(compat.metric_defaults(metric)) == {"mean_value", "weight"}
    state = compat.metric_state(metric)
    metric.update(torch.tensor(3.0))
    assert metric._update_count == 1
    compat.restore_metric_state(metric, state)
    assert metric._update_count == 0 and state["mean_value"] is metric.mean_value


def _metric_private_names() -> set[str]:
    """The private names of a torchmetrics Metric that an nn.Module does not have."""
    import torch
    from torchmetrics import MeanMetric

    module = set(dir(torch.nn.Module()))
    return {n for n in dir(MeanMetric()) if n.startswith("_") and not n.startswith("__") and n not in module}


def test_no_module_but_compat_touches_a_private_torchmetrics_attribute():
    """`metric._defaults`, `metric._update_count`, ...: the private names of a torchmetrics Metric (those an
    nn.Module does not have) appear only in compat/."""
    private = _metric_private_names()
    found = []
    for path in Path(attnlab.__file__).parent.rglob("*.py"):
        if path.parent == COMPAT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.Constant) and node.value in ("_defaults", "_update_count"):
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == [], found
    assert "_defaults" in inspect.getsource(compat) and "_update_count" in inspect.getsource(compat)


def test_no_module_but_compat_touches_a_private_lightning_attribute():
    """`trainer._x`, `loop._x`, `super()._x(...)`: private names of Lightning objects appear only in compat/."""
    suspects = ("trainer", "loop", "fit_loop", "super()", "_trainer", "connector")
    found = []
    for path in Path(attnlab.__file__).parent.rglob("*.py"):
        if path.parent == COMPAT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = ast.unparse(node.value)
                if owner.split(".")[-1] in suspects or owner.endswith(("trainer", "_connector")):
                    found.append(f"{path.name}:{node.lineno} {owner}.{node.attr}")
    assert found == [], found
    import attnlab.compat.checkpoint as checkpoint

    assert inspect.getsource(compat).count("._") + inspect.getsource(checkpoint).count("._") > 5  # and here they are


def private_imports(source: str) -> list[tuple[int, str]]:
    """(line, name) of each import of another package's private name in `source`: `from x import _y`,
    `from x._y import z`, `import x._y` (the standard library's own private modules, such as `_codecs`, and
    attnlab's own modules are not counted)."""
    import sys

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in ("attnlab", "hydra_plugins") and top not in sys.stdlib_module_names and any(
                    p.startswith("_") and not p.startswith("__") for p in name.split(".")):
                found.append((node.lineno, name))
                break
    return found


def test_no_module_but_compat_imports_a_private_name():
    src = Path(attnlab.__file__).parents[1]
    found = [f"{path.relative_to(src)}:{line} {name}" for path in sorted(src.rglob("*.py"))
             if path.parent != COMPAT for line, name in private_imports(path.read_text())]
    assert found == [], found


def test_the_check_finds_a_private_import():
    source = ("from torch.utils._pytree import tree_leaves\nfrom lightning.x import _y\nimport a._b\n"
              "from hydra_plugins.attnlab_slurm_launcher.slurm_launcher import SlurmLauncher\nimport _codecs\nimport os.path\n")
    assert private_imports(source) == [(1, "torch.utils._pytree"), (2, "lightning.x._y"), (3, "a._b")]


def test_a_rank_ending_on_purpose_is_not_killed_by_lightnings_observer():
    """Lightning's launcher (`trainer=ddp_cpu`) watches the ranks it started and SIGKILLs rank 0 and every rank once
    one ends non-zero. Once it is stood down, a rank that ends with 143 (stopped on a signal) leaves rank 0 alone."""
    import subprocess
    import sys

    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    rank0 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    rank1 = subprocess.Popen([sys.executable, "-c", "raise SystemExit(143)"])
    try:
        observer = _ChildProcessObserver(main_pid=rank0.pid, child_processes=[rank1], sleep_period=1.0)
        observer.start()
        compat.stand_down_rank_observer()
        rank1.wait(10)
        observer.join(10)
        assert not observer.is_alive()
        with pytest.raises(subprocess.TimeoutExpired):  # rank 0 lives on: not killed (a kill takes a moment)
            rank0.wait(2)
    finally:
        rank0.kill()
        rank0.wait()
