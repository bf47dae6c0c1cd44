"""A user's own code through attnlab without editing it (tests/userproject is such a user's folder): a LightningModule
in a config of their own, a backbone by dotted path, modules imported through extras.imports, and any folder of
class folders through data=imagefolder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image


from attnlab.cli.training import train
from attnlab.config import PLATFORM_KEYS, constructor_kwargs
from attnlab.errors import UserError
from conftest import FAST, ROOT, compose_cfg

PROJECT = ROOT / "tests" / "userproject"
USER_CONFIGS = f"hydra.searchpath=[file://{PROJECT / 'configs'}]"
SHORT = ["trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", *FAST]


@pytest.fixture(autouse=True)
def _user_package_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT))  # as when running from the user's folder


def TinyCNN(**kwargs):
    from userpkg.nets import TinyCNN

    return TinyCNN(**kwargs)


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_a_plain_lightning_module_trains_checkpoints_resumes_and_evaluates(tmp_path):
    """lightning-hydra-template's style: the module keeps its network among its hyperparameters. Its checkpoints hold
    the network's config node instead of the pickled network, so they load with weights_only=True; eval.py builds it
    again where the user's own configs name it, and a checkpoint with the pickled network loads once trusted."""
    from attnlab.cli.eval import evaluate

    first = tmp_path / "first"
    value = train(compose_cfg([USER_CONFIGS, "model=lit_cnn", "trainer.max_epochs=2", *SHORT], first))
    metrics = _metrics(first)
    # no attnlab key in its config: the best checkpoint follows val/loss, which the sweepers get as val/loss_best
    assert value == pytest.approx(metrics["val/loss_best"]) and "test/acc" in metrics
    ckpt = torch.load(first / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 8 and ckpt["attnlab"]["config"]["model"]["_target_"] == "userpkg.module.LitClassifier"
    assert ckpt["hyper_parameters"]["net"]["_target_"] == "userpkg.nets.TinyCNN"  # its config node, not a pickle
    assert ckpt["hparams_from_config"] == ["net"]
    assert len(list((first / "checkpoints").glob("epoch_*.ckpt"))) == 1

    second = tmp_path / "second"
    train(compose_cfg([USER_CONFIGS, "model=lit_cnn", "trainer.max_epochs=3", *SHORT,
                       f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}"], second))
    last = second / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 12  # continued

    def evaluate_with(*args):
        out = tmp_path / f"eval{len(list(tmp_path.glob('eval*')))}"
        out.mkdir()
        result = evaluate(compose_cfg([*args, "trainer.limit_test_batches=2"], out, config_name="eval"))
        assert 0.0 <= result["test/acc"] <= 1.0 and (out / "metrics.json").is_file()

    evaluate_with(f"ckpt_path={last}", USER_CONFIGS)  # the user's config folder names the module and its network
    with pytest.raises(UserError, match=r"names userpkg\.module\.LitClassifier \(config\.model\._target_\).*"
                                        r"--config-dir.*trust_checkpoint=true"):
        evaluate_with(f"ckpt_path={last}")  # named by nothing of this command's

    pickled = tmp_path / "pickled.ckpt"  # as attnlab wrote such checkpoints before: the network pickled
    ckpt = torch.load(last, weights_only=True)
    ckpt["hyper_parameters"]["net"] = TinyCNN(num_classes=10, in_chans=1)
    del ckpt["hparams_from_config"]
    torch.save(ckpt, pickled)
    with pytest.raises(UserError, match=r"asks for userpkg\.nets\.TinyCNN.*trust_checkpoint=true"):
        evaluate_with(f"ckpt_path={pickled}", USER_CONFIGS)
    evaluate_with(f"ckpt_path={pickled}", "trust_checkpoint=true")


@pytest.mark.slow
def test_a_user_experiment_and_sweep_from_the_user_folder_with_config_dir(tmp_path):
    """`python -m attnlab.train --config-dir configs -m experiment=... optimizer.lr=...` from the user's own folder
    (importable as under `python -m`), two jobs, one results table."""
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_CACHE_DIR": str(tmp_path / "cache"),
                        "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "attnlab.train", "--config-dir", "configs", "-m", "experiment=lit_cnn_digits",
         "optimizer.lr=1e-3,1e-2", "trainer.max_epochs=1", "test=false", *SHORT],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    (table,) = (tmp_path / "logs" / "lit_cnn_digits" / "multiruns").glob("*/results.csv")
    rows = pd.read_csv(table)
    assert len(rows) == 2 and (rows["metric"] == "val/acc_best").all() and rows["value"].between(0, 1).all()
    assert not (PROJECT / "logs").exists()


def test_a_backbone_of_the_users_own_by_dotted_path(tmp_path):
    train(compose_cfg(["model.backbone=userpkg.nets.TinyCNN", "+model.backbone_kwargs.width=8",
                       "model.freeze_backbone=true", "trainer.max_epochs=1", *SHORT], tmp_path))
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["state_dict"]["net.features.0.weight"].shape == (8, 1, 3, 3)  # in_chans from the digits: 1
    assert _metrics(tmp_path)["test/acc"] >= 0.0

    for backbone, message in [("userpkg.nets.NoSuchNet", "neither a timm model nor an importable"),
                              ("torch.nn.Linear", "does not take num_classes and in_chans")]:
        with pytest.raises(UserError, match=message):
            train(compose_cfg([f"model.backbone={backbone}", "debug=fdr", *FAST], tmp_path / "bad"))


def test_extras_imports_registers_the_users_timm_model(tmp_path):
    train(compose_cfg(["extras.imports=[userpkg.timm_models]", "model.backbone=tiny_user_mlp",
                       "trainer.max_epochs=1", *SHORT], tmp_path))
    assert "test/acc" in _metrics(tmp_path)
    with pytest.raises(UserError, match=r"extras.imports names the module userpkg.missing.*PYTHONPATH"):
        train(compose_cfg(["extras.imports=[userpkg.missing]", "debug=fdr", *FAST], tmp_path / "bad"))


def test_a_model_target_that_cannot_be_imported_says_what_to_check(tmp_path):
    with pytest.raises(UserError, match=r"model._target_=userpkg.nowhere.Task cannot be imported.*extras.imports"):
        train(compose_cfg(["model._target_=userpkg.nowhere.Task", "debug=fdr", *FAST], tmp_path))


def test_platform_keys_are_one_declared_list_taken_off_unless_the_constructor_names_them():
    class Plain:
        def __init__(self, lr: float = 1.0, monitor: str = "val/loss"):
            pass

    kwargs, taken_off = constructor_kwargs("model", {"lr": 2.0, "monitor": "val/acc", "data_kinds": ["images"],
                                                     "compile": False}, Plain)
    assert kwargs == {"lr": 2.0, "monitor": "val/acc"} and set(taken_off) == {"data_kinds", "compile"}
    assert {"monitor", "monitor_mode", "data_kinds", "compile"} <= set(PLATFORM_KEYS["model"])
    assert {"blr", "layer_decay"} <= set(PLATFORM_KEYS["optimizer"]) and "kind" in PLATFORM_KEYS["data"]


def _image_tree(root: Path, classes=("cat", "dog", "owl"), per_class=10, size=20) -> None:
    g = torch.Generator().manual_seed(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (torch.rand(size, size, 3, generator=g) * 80 + c * 80).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(root / name / f"{i}.png")


@pytest.mark.parametrize("layout", ["class_folders", "split_folders"])
def test_imagefolder_through_train_py_finds_its_classes_and_logs(tmp_path, layout):
    """data.num_classes left at null: the folders give it, and the CSV logger (which logs hyperparameters) takes the
    run."""
    root = tmp_path / "images"
    if layout == "class_folders":
        _image_tree(root)
    else:
        _image_tree(root / "train")
        _image_tree(root / "val", per_class=3)
    run = tmp_path / "run"
    train(compose_cfg(["data=imagefolder", f"data.root={root}", "data.image_size=16", "data.batch_size=4",
                       "data.num_workers=0", "trainer.max_epochs=1", *SHORT], run))
    metrics = _metrics(run)
    assert "val/acc" in metrics and "test/acc" in metrics
    assert "train/loss_epoch" in pd.read_csv(run / "csv" / "metrics.csv").columns
    hparams = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["hyper_parameters"]
    assert hparams["num_classes"] == 3 and hparams["class_names"] == ["cat", "dog", "owl"]


def test_predict_py_finds_each_tasks_predictor_or_says_how_to_give_one():
    import lightning as L

    from attnlab.cli.predict import predictor_for
    from attnlab.errors import UserError
    from attnlab.tasks.language_model import CausalLM, MaskedLM

    assert predictor_for(CausalLM) is predictor_for(MaskedLM)  # one module per task module
    assert predictor_for(CausalLM).__module__ == "attnlab.cli.predict.language_model"

    class Mine(L.LightningModule):
        pass

    with pytest.raises(UserError, match=r"predict.py does not know how .*Mine predicts: give the class a `predictor`"):
        predictor_for(Mine)
    Mine.predictor = "json.dumps"  # any importable function predict(model, cfg, run_cfg)
    import json

    assert predictor_for(Mine) is json.dumps


def test_objects_a_config_node_built_are_saved_as_that_node_and_built_again(tmp_path):
    """lightning-hydra-template's modules keep the optimizer and scheduler partials too (save_hyperparameters without
    ignore), and an OmegaConf container may be the hyperparameters themselves: all load with weights_only=True."""
    import functools
    import io

    from omegaconf import OmegaConf

    from attnlab.callbacks.plain_hparams import config_nodes, plain_hparams, rebuild_hparams
    from attnlab.cli.builders import instantiate
    from attnlab.settings import split_optimizer

    config = {"model": {"_target_": "userpkg.module.LitClassifier",
                        "net": {"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 3}},
              "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1, "blr": None},
              "scheduler": {"_target_": "torch.optim.lr_scheduler.StepLR", "_partial_": True, "step_size": 2}}
    ckpt = {"hyper_parameters": {"net": torch.nn.Linear(2, 3), "lr": 0.1, "compile": False,
                                 "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
                                 "scheduler": functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2)},
            "datamodule_hyper_parameters": OmegaConf.create({"batch_size": 8}), "datamodule_hparams_type": dict}
    own_arguments = split_optimizer(config["optimizer"])[0]  # as the run's plan holds them (RunPlan.optimizer)
    assert plain_hparams(ckpt, config_nodes(config["model"], own_arguments, config["scheduler"])) == []
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert sorted(loaded["hparams_from_config"]) == ["net", "optimizer", "scheduler"]
    assert "blr" not in loaded["hyper_parameters"]["optimizer"] and loaded["datamodule_hyper_parameters"] == {
        "batch_size": 8}
    rebuild_hparams(loaded, instantiate)
    hparams = loaded["hyper_parameters"]
    assert isinstance(hparams["net"], torch.nn.Linear) and hparams["net"].out_features == 3
    optimizer = hparams["optimizer"](params=hparams["net"].parameters())
    assert isinstance(optimizer, torch.optim.SGD) and hparams["scheduler"](optimizer).step_size == 2


def test_the_network_of_a_task_is_found_where_nn_module_keeps_it():
    """A task's `net` is a submodule, which nn.Module keeps in its `_modules` and serves through `__getattr__`:
    export.py finds it there on every Python (a Protocol's isinstance check reads attributes statically from 3.12)."""
    from attnlab.protocols.task import network

    class Task(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 3)

    task = Task()
    assert "net" not in vars(task) and network(task) is task.net
    assert network(torch.nn.Module()) is None
