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
SRC = Path(attnlab.__file__).parents[1]  # attnlab and hydra_plugins
BRIDGE = Path(attnlab.__file__).parent / "cluster" / "submitit_bridge.py"  # submitit's door


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


def test_the_torch_hydra_omegaconf_optuna_and_csv_internals_compat_uses_exist(tmp_path):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from lightning.pytorch.core.saving import _load_state
    from lightning.pytorch.utilities.migration.utils import _pl_migrate_checkpoint
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    assert all(callable(f) for f in (ConfigLoaderImpl._apply_overrides_to_config, Hydra.get_mode, _load_state,
                                     _pl_migrate_checkpoint, _load_state_dict))
    assert compat.hydra_args_parser().parse_args(["a=1"]).overrides == ["a=1"]
    assert isinstance(compat.dispatch_mode_class(), type) and isinstance(compat.dcp_empty_planner_class(), type)
    assert callable(compat.activation_checkpointing()[1]) and "torch.Size" in compat.weights_only_globals()
    with compat.fake_tensor_mode():
        pass
    import optuna
    import torch
    from lightning.pytorch.callbacks import RichProgressBar
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"a": "${b}", "b": 1, "c": {"d": 2}})
    assert compat.raw_value(cfg, "a") == "${b}" and compat.raw_value(cfg, "b") == 1
    assert OmegaConf.is_config(compat.config_node(cfg, "c"))
    t = torch.zeros(4)
    assert compat.storage_key(t.untyped_storage()) == compat.storage_key(t[1:].untyped_storage())
    assert compat.storage_key(t.untyped_storage()) != compat.storage_key(torch.zeros(4).untyped_storage())
    with compat.compile_keeps_dynamic_shapes():
        assert torch._dynamo.config.capture_dynamic_output_shape_ops
    assert all(callable(v) for v in compat.dcp_metadata_private_names().values())
    study = optuna.create_study()
    trial = study.ask()
    compat.set_stored_attr(study, trial, "job_dir", "here")
    assert compat.stored_trial(study, trial).user_attrs == {"job_dir": "here"}
    assert optuna.trial.Trial(study, compat.optuna_trial_id(trial)).number == trial.number
    assert callable(RichProgressBar._get_train_description)
    first = compat.appending_csv_logger(save_dir=str(tmp_path), name="csv", version="")
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    again = compat.appending_csv_logger(save_dir=str(tmp_path), name="csv", version="")
    again.log_metrics({"loss": 0.5}, step=1)
    again.save()
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    assert rows[0].split(",") == ["loss", "step"] and len(rows) == 3, rows
    loader = torch.utils.data.DataLoader(range(8), num_workers=1)
    it = iter(loader)
    next(it)
    compat.shut_down_loader_workers(it)
    assert not any(w.is_alive() for w in it._workers)


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


# the one name with a leading underscore that its package documents as public: os._exit, the end of a process
# without cleanup
PUBLIC_UNDERSCORED = {"_exit"}
OUR_SOURCES = [p for p in sorted(SRC.rglob("*.py")) if p.parent != COMPAT and p != BRIDGE]


def _defined(body: list) -> set[str]:
    """The names that the statements of a module's or a class's body define: functions, classes, assignments."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def own_private_names(trees) -> tuple[set[str], set[str]]:
    """(names attnlab's objects have: methods and attributes of its classes, attributes it sets on `self`/`cls`;
    names its modules define at their top level), each a private name of attnlab's own."""
    on_objects, in_modules = set(), set()
    for tree in trees:
        in_modules |= _defined(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                on_objects |= _defined(node.body)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    on_objects |= {n.attr for n in ast.walk(target) if isinstance(n, ast.Attribute)
                                   and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}
    return on_objects, in_modules


def foreign_private_uses(source: str, on_objects: set[str], in_modules: set[str]) -> list[tuple[int, str]]:
    """(line, text) of each read or write of another package's private attribute in `source`: `x._y`, or
    `getattr(x, "_y")` (and hasattr, setattr), where `_y` is no name of attnlab's own (`own_private_names`; on one
    of attnlab's modules imported by name, its top-level names count too)."""
    tree = ast.parse(source)
    modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and (n.level or (n.module or "").startswith(("attnlab", "hydra_plugins.attnlab"))) for a in n.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name, owner = node.attr, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "hasattr", "setattr") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            name, owner = node.args[1].value, node.args[0]
        else:
            continue
        if not isinstance(name, str) or not name.startswith("_") or name.startswith("__") or name in PUBLIC_UNDERSCORED:
            continue
        own = name in on_objects or (isinstance(owner, ast.Name) and owner.id in modules and name in in_modules)
        if not own:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_but_compat_touches_another_packages_private_attribute():
    """Lightning's `trainer._logger_connector`, OmegaConf's `node._get_node`, a DataLoader iterator's
    `_shutdown_workers`, Optuna's `trial._trial_id`: every private attribute of another package is read or set in
    compat/ (submitit's in cluster/submitit_bridge.py), behind a public name of attnlab's."""
    trees = [ast.parse(p.read_text()) for p in OUR_SOURCES]
    on_objects, in_modules = own_private_names(trees)
    found = [f"{p.relative_to(SRC)}:{line} {text}" for p in OUR_SOURCES
             for line, text in foreign_private_uses(p.read_text(), on_objects, in_modules)]
    assert found == [], found


def test_the_check_finds_another_packages_private_attribute():
    on_objects, in_modules = own_private_names([ast.parse(
        "def _value(v):\n    return v\nclass Mine:\n    def _helper(self):\n        self._seen = 1\n")])
    source = ("from attnlab.cli import rerun\nx = trainer._logger_connector\ny = node._get_node(k)._value()\n"
              "z = getattr(it, '_shutdown_workers', None)\nclass W(ExperimentWriter):\n"
              "    def f(self):\n        return self._fs\n"
              "ok = (self._seen, mine._helper(), rerun._value, os._exit)\n")
    found = {text for _, text in foreign_private_uses(source, on_objects, in_modules)}
    assert found == {"trainer._logger_connector", "node._get_node(k)._value", "node._get_node",
                     "getattr(it, '_shutdown_workers', None)", "self._fs"}


def test_no_class_of_attnlab_outside_compat_overrides_a_private_method_of_another_package():
    """A subclass of an upstream class (a LightningModule, a Lightning callback, a torchmetrics Metric) that
    defines a private name its upstream base already has changes that package's internals: it belongs in compat/."""
    import importlib
    import pkgutil

    found = []
    plugins = [importlib.import_module(f"hydra_plugins.attnlab_{p}") for p in ("optuna_sweeper", "slurm_launcher")]
    modules = [info.name for package in (attnlab, *plugins)
               for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    for module_name in modules:
        if module_name.startswith("attnlab.compat") or module_name.endswith("__main__"):
            continue
        module = importlib.import_module(module_name)
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            cls = getattr(module, node.name, None) if isinstance(node, ast.ClassDef) else None
            if not isinstance(cls, type):
                continue
            own = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for name in own:
                if name.startswith("_") and not name.startswith("__"):
                    upstream = [b for b in cls.__mro__[1:] if not b.__module__.startswith(
                        ("attnlab", "hydra_plugins.attnlab")) and name in vars(b)]
                    if upstream:
                        found.append(f"{module_name}.{node.name}.{name} ({upstream[0].__module__})")
    assert found == [], found


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
