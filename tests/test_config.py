"""Config composition: every declared-compatible model x data pair composes, others are refused clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from attnlab.config import CONF_DIR, check_compatible
from attnlab.errors import UserError
from conftest import ROOT, compose_cfg, run_here

MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
DATA = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """Every data config and every model config, each composed once. A model or data config is a node of its own
    group (none is `@package _global_`), so the pair model=M data=D composes to M's config with D's data node: the
    test below builds the pairs that way and checks it against Hydra on one pair of each model."""
    tmp = tmp_path_factory.mktemp("kinds")
    data = {d: compose_cfg([f"data={d}"], tmp) for d in DATA}
    models = {m: compose_cfg([f"model={m}"], tmp) for m in MODELS}
    return data, models, tmp


def pair(composed, model: str, data: str):
    data_cfgs, model_cfgs, _ = composed
    cfg = model_cfgs[model].copy()
    cfg.data = data_cfgs[data].data.copy()
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_every_model_composes_with_every_data_config_or_is_refused(tmp_path, model, composed):
    data_cfgs, model_cfgs, _ = composed
    data_kinds = {d: c.data.kind for d, c in data_cfgs.items()}
    accepted = list(model_cfgs[model].model.data_kinds)
    compatible = [d for d in DATA if data_kinds[d] in accepted]
    assert compatible, f"model={model} takes no data config"
    # the pairs built from the configs composed alone are what Hydra composes
    by_hydra = compose_cfg([f"model={model}", f"data={compatible[-1]}"], tmp_path)
    built = pair(composed, model, compatible[-1])
    for node in ("model", "data", "optimizer", "trainer"):
        assert OmegaConf.to_container(by_hydra[node]) == OmegaConf.to_container(built[node]), node
    for data in compatible:
        cfg = pair(composed, model, data)
        assert cfg.data.kind in cfg.model.data_kinds  # as the two configs alone said
        check_compatible(cfg)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        # what the model reads from the data (num_classes, image_size, vocab_size, ...) resolves to it
        links = {k: v[len("${data."):-1] for k, v in OmegaConf.to_container(cfg.model).items()
                 if isinstance(v, str) and v.startswith("${data.") and v.endswith("}")}
        assert links, f"model={model} reads nothing from the data"
        for key, data_key in links.items():
            assert resolved["model"][key] == resolved["data"][data_key]
    # every other pair is refused: one of each other kind composed in full, the rest as the check sees them
    others = [d for d in DATA if d not in compatible]
    for data in {data_kinds[d]: d for d in others}.values():
        with pytest.raises(UserError, match="Compatible data configs"):
            check_compatible(compose_cfg([f"model={model}", f"data={data}"], tmp_path))
    for data in others:
        with pytest.raises(UserError, match="Compatible data configs"):
            check_compatible(pair(composed, model, data))


def test_incompatible_pair_names_the_compatible_choices(tmp_path):
    cfg = compose_cfg(["model=swin", "data=digits"], tmp_path)
    cfg.data.kind = "text"  # a data kind no image model takes
    with pytest.raises(UserError) as err:
        check_compatible(cfg)
    msg = str(err.value)
    assert "model=swin" in msg and "'text'" in msg
    for name in ("cifar10", "digits", "imagefolder", "imagenet", "mnist"):
        assert name in msg


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_configs_compose(tmp_path, experiment):
    cfg = compose_cfg([f"experiment={experiment}"], tmp_path)
    OmegaConf.to_container(cfg, resolve=True)
    assert cfg.task_name == experiment


@pytest.mark.slow
@pytest.mark.parametrize("group", ["model", "data", "optimizer", "scheduler", "trainer"])
def test_each_option_maps_to_a_constructor(tmp_path, group):
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        cfg = compose_cfg([f"{group}={path.stem}"], tmp_path)
        assert "_target_" in cfg[group], f"{group}/{path.name} has no _target_"
        if group in ("optimizer", "scheduler"):
            assert cfg[group]._partial_ is True


@pytest.mark.parametrize("override", [
    "optimizer=sgd", "optimizer=adam", "scheduler=linear", "scheduler=constant", "scheduler=plateau",
    "trainer=gpu", "trainer=ddp", "trainer=fsdp", "trainer=multinode", "trainer.precision=bf16-mixed",
    "model.compile=true", "logger=wandb", "logger=tensorboard", "logger=many", "debug=fdr", "debug=overfit",
    "debug=limit", "debug=profiler", "callbacks=early_stopping", "callbacks=ema", "hparams_search=vit_digits_optuna",
    "launcher=slurm", "launcher=local", "scheduler=onecycle",
])
def test_command_line_choices_compose(tmp_path, override):
    OmegaConf.to_container(compose_cfg([override], tmp_path), resolve=True)


def test_unknown_option_lists_the_choices():
    out = run_here("train.py", "model=nosuchmodel")
    assert out.returncode == 2
    assert "attnlab: error: model=nosuchmodel: the config group 'model' has no option 'nosuchmodel'." in out.stdout
    for name in ("vit", "swin", "resnet50"):
        assert name in out.stdout


def test_cfg_job_prints_resolved_config_without_importing_torch():
    code = (
        "import sys; sys.argv=['train.py','model=swin','data=imagenet','trainer=ddp','--cfg','job','--resolve'];"
        "from attnlab.cli.train import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy=[m for m in ('torch','timm','datasets','lightning','optuna') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    job = yaml.safe_load(out.stdout.split("HEAVY")[0])
    assert job["model"]["backbone"] == "swin_tiny_patch4_window7_224"
    assert job["model"]["num_classes"] == 1000
    assert job["trainer"]["strategy"]["_target_"].endswith("DDPStrategy")


def test_fast_precision_is_bf16_only_where_the_device_has_bf16_units(monkeypatch):
    import attnlab.config as config

    monkeypatch.setattr(config, "_cpu_has_bf16_units", lambda: True)
    assert config.fast_precision("cpu") == "bf16-mixed"
    monkeypatch.setattr(config, "_cpu_has_bf16_units", lambda: False)
    assert config.fast_precision("cpu") == "32-true"  # emulated bf16 is slower than fp32
    assert config.fast_precision("mps") == "32-true"
    monkeypatch.undo()  # the run below asks this machine's CPU
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    native = "avx512_bf16" in flags.split() or "amx_bf16" in flags.split()
    out = run_here("train.py", "experiment=bert_sst2_finetune", "--cfg", "job", "--resolve")
    assert out.returncode == 0, out.stdout
    assert yaml.safe_load(out.stdout)["trainer"]["precision"] == ("bf16-mixed" if native else "32-true")


def test_the_entry_configs_and_the_run_settings_agree_on_every_default():
    """The run keys have their defaults in two places, the entry configs (what a user reads) and `RunSettings` (what
    a config that leaves a key out gets): they must say the same, and every run key of an entry config is declared."""
    import dataclasses

    from attnlab.settings import RunSettings

    declared = {f.name: f for f in dataclasses.fields(RunSettings)}
    groups = {"defaults", "tags", "data", "model", "trainer", "callbacks", "logger", "paths", "extras", "hydra"}
    for entry in ("train", "eval"):
        cfg = OmegaConf.load(CONF_DIR / f"{entry}.yaml")
        for key in cfg:
            if key in groups:
                continue
            assert key in declared, f"conf/{entry}.yaml: run key {key} is not declared in attnlab.settings.RunSettings"
            f = declared[key]
            if key == "task_name" or OmegaConf.is_missing(cfg, key) or OmegaConf.is_interpolation(cfg, key):
                continue  # names the entry point / must be given / follows another key
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            value = OmegaConf.to_container(cfg[key]) if OmegaConf.is_config(cfg[key]) else cfg[key]
            if isinstance(value, dict) and default is None:  # a group of settings, all unset, is no setting
                value = None if all(v is None for v in value.values()) else value
            assert value == default, f"conf/{entry}.yaml: {key}: {value!r}, RunSettings: {default!r}"


def test_a_target_named_before_the_data_modules_moved_still_builds():
    """Run folders and checkpoints written before attnlab.data's flat modules moved into subpackages name their
    classes by the old dotted paths: each resolves to the class of today's layout, and the trust rule admits the old
    name of a packaged data module as it admits the new one."""
    import importlib
    import inspect

    from hydra.utils import get_object

    from attnlab.checkpoints import trust
    from attnlab.checkpoints.trust import MOVED_MODULES, current_target

    for old, new in MOVED_MODULES.items():
        module = importlib.import_module(new)
        classes = [name for name, obj in vars(module).items() if inspect.isclass(obj) and obj.__module__ == new]
        for name in classes:
            assert get_object(current_target(f"{old}.{name}")) is getattr(module, name), (old, name)
    assert get_object(current_target("attnlab.data.segmentation.VOCDataModule")).__name__ == "VOCDataModule"
    for name in ("attnlab.data.cifar.CIFARDataModule", "attnlab.data.text.TextDataModule",
                 "attnlab.data.segmentation.ADE20KDataModule"):
        assert trust.decide("callable", name, "data._target_"), name
    assert not trust.decide("callable", "attnlab.data.cifar.os.system", "data._target_")


def test_a_config_of_the_flat_data_layout_is_prepared_with_todays_names(tmp_path):
    """A run folder's config from before the data modules moved (what --rerun composes from) has its `_target_`s
    renamed when it is prepared: the checks, the builders and the new run folder's config.yaml see today's names."""
    from attnlab.config import prepare

    cfg = compose_cfg(["data=cifar10"], tmp_path)
    cfg.data._target_ = "attnlab.data.cifar.CIFARDataModule"
    cfg.trainer._target_ = "lightning.pytorch.Trainer"  # never moved: kept
    prepare(cfg)
    assert cfg.data._target_ == "attnlab.data.images.cifar.CIFARDataModule"
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"
