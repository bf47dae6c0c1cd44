"""The private APIs of other packages that attnlab relies on, one test each: an upgrade that renames or removes one
fails here, naming it, instead of somewhere deep in a training run. pyproject.toml bounds these packages to the
tested range; widen a bound only with this file green."""

from __future__ import annotations

import inspect
from importlib.metadata import requires, version

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torchmetrics import MeanMetric

# packages whose internals attnlab uses -> what of them (for the message)
BOUNDED = {
    "lightning": "trainer connectors, fit-loop and ModelCheckpoint internals",
    "torchmetrics": "Metric._defaults",
    "timm": "ViT state-dict key names (MAE -> ViT)",
    "hydra-core": "HydraConfig and the launcher/sweeper plugin names",
    "omegaconf": "resolver and flag behaviour",
    "segmentation-models-pytorch": "the encoder wrapper's parameter names",
    "optuna": "Study._storage (the sweeper marks a trial interrupted before failing it)",
    "submitit": "the SLURM executor's _make_submission_file_text, the requeue handler's has_timed_out and "
                "checkpoint_and_try_requeue",
    "hydra-submitit-launcher": "its SlurmLauncher, which attnlab's launcher plugin extends",
    "torch": "torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE) that the ranks share their run folder through",
    "litdata": "the streaming loader's restore flag, epoch and state keys, the dataset's distributed_env",
}


def _requirement(package: str):
    """attnlab's requirement on `package` by its name, so `lightning` is not read from `lightning-utilities`."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found = (Requirement(r) for r in requires("attnlab") or [])
    return next((r for r in found if canonicalize_name(r.name) == canonicalize_name(package)), None)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("package", sorted(BOUNDED))
def test_packages_whose_internals_are_used_have_an_upper_bound(package):
    spec = _requirement(package)
    assert spec and "<" in str(spec.specifier), f"pyproject.toml: bound {package} from above ({BOUNDED[package]})"


@pytest.mark.parametrize("package", sorted(BOUNDED))
def test_the_installed_version_is_within_the_tested_range(package):
    """The range in pyproject.toml is the tested one: an installed version outside it (pip --no-deps, a site's own
    build) fails here, naming the package and what of it attnlab uses."""
    spec = _requirement(package)
    installed = version(package)
    assert spec.specifier.contains(installed, prereleases=True), \
        f"{package} {installed} is outside attnlab's tested range {spec.specifier} ({BOUNDED[package]})"


def test_the_end_of_a_process_finds_cpythons_exit_handler_runner():
    """attnlab.cli.app.end_process runs the exit handlers itself to skip the teardown of the modules; without this
    function it leaves them to the interpreter (slower, nothing lost)."""
    import atexit

    assert callable(getattr(atexit, "_run_exitfuncs", None)), "atexit._run_exitfuncs"


@pytest.fixture(scope="module")
def trainer():
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)


def test_trainer_connectors(trainer):
    # tasks/base.py logs train/loss only on the steps the loggers write
    assert isinstance(trainer._logger_connector.should_update_logs, bool), "Trainer._logger_connector.should_update_logs"
    # data/translation/datamodule.py: its batch samplers shard by rank, so Lightning must not replace them
    assert isinstance(trainer._accelerator_connector.use_distributed_sampler, bool), \
        "Trainer._accelerator_connector.use_distributed_sampler"


def test_fit_loop_state_that_resume_at_the_exact_batch_restores(trainer):
    # callbacks/resume.py
    loop = trainer.fit_loop
    for name in ("_combined_loader_states_to_load", "_combined_loader", "_data_fetcher"):
        assert hasattr(loop, name), f"fit_loop.{name}"
    assert _params(CombinedLoader._load_state_dicts) == ["self", "states"], "CombinedLoader._load_state_dicts(states)"


def test_model_checkpoint_internals():
    # callbacks/checkpoint.py: last.ckpt refreshed at every save point, the monitored value kept across a resume
    for name, params in {"_monitor_candidates": ["self", "trainer"],
                         "_should_skip_saving_checkpoint": ["self", "trainer"],
                         "_save_last_checkpoint": ["self", "trainer", "monitor_candidates"],
                         "_should_save_on_train_epoch_end": ["self", "trainer"],
                         "check_monitor_top_k": ["self", "trainer", "current"]}.items():
        assert _params(getattr(ModelCheckpoint, name)) == params, f"ModelCheckpoint.{name}{tuple(params[1:])}"


def test_progress_bar_description_hook():
    # callbacks/progress.py
    assert _params(RichProgressBar._get_train_description) == ["self", "current_epoch"]
    assert "validation_description" in dir(RichProgressBar)


def test_csv_logger_internals(tmp_path):
    # loggers.py: a resumed run appends to its metrics.csv
    assert hasattr(ExperimentWriter, "_check_log_dir_exists")
    logger = CSVLogger(save_dir=tmp_path, name="csv", version="")
    assert logger._experiment is None and hasattr(logger, "_fs") and logger.root_dir
    assert hasattr(logger.experiment, "metrics_file_path")


def test_torchmetrics_metric_defaults():
    # tasks/base.py: checkpoints written before the running loss mean was saved load with its initial state
    assert set(MeanMetric()._defaults) == {"mean_value", "weight"}


def test_the_installed_versions_are_within_the_bounds():
    from packaging.requirements import Requirement

    for spec in requires("attnlab") or []:
        req = Requirement(spec)
        if req.marker is None and req.name.lower() in BOUNDED:
            assert req.specifier.contains(version(req.name), prereleases=True), f"{req.name} {version(req.name)} " \
                f"is outside {req.specifier}"


def test_litdata_loader_state_and_distributed_env():
    # data/formats/shard_loader.py: the run's epoch given to the loader unless it resumes (restore), the layout a state was
    # saved with (its keys), the dataset's distributed_env rebuilt from its type for the trainer's world and rank
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.utilities.env import _DistributedEnv

    assert _params(_DistributedEnv.__init__)[1:] == ["world_size", "global_rank", "num_nodes"]
    loader = inspect.getsource(StreamingDataLoader.__iter__)
    assert "self.restore" in loader and "self.current_epoch += 1" in loader, "StreamingDataLoader.__iter__"
    saved = inspect.getsource(StreamingDataset.state_dict)
    for key in ("world_size", "num_workers", "batch_size", "input_dir_path", "input_dir_url"):
        assert f'"{key}"' in saved, f"StreamingDataset.state_dict()[{key!r}]"


def test_optuna_study_storage_user_attrs():
    import optuna

    study = optuna.create_study()
    trial = study.ask()
    study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)  # what the sweeper does
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    assert study.trials[0].user_attrs == {"interrupted": True}
