"""Typed checks of the composed config (attnlab.cli.checks): one general mechanism against the constructors'
signatures, type hints and declared ranges. Each kind of mistake is covered once here, through that mechanism."""

from __future__ import annotations

import time

import pytest

from attnlab.cli.builders import build_datamodule
from attnlab.cli.checks import check_config
from attnlab.cli.training import train
from attnlab.config import CONF_DIR, prepare
from attnlab.errors import UserError
from conftest import FAST, compose_cfg, run_here

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
MODELS = {"gpt_char": "tinyshakespeare", "bert_small": "tinyshakespeare data.objective=masked", "transformer_seq2seq_small": "multi30k",
          "rnn_seq2seq": "multi30k", "unet": "membrane", "segmentation": "membrane", "mae": "digits",
          "swin": "digits", "resnet50": "digits"}


@pytest.mark.parametrize("overrides", [[f"experiment={e}"] for e in EXPERIMENTS]
                         + [[f"model={m}", *f"data={d}".split()] for m, d in MODELS.items()], ids=str)
def test_every_packaged_config_passes_the_checks(overrides, tmp_path):
    cfg = compose_cfg(overrides, tmp_path)
    prepare(cfg)
    check_config(cfg)


@pytest.mark.parametrize("overrides, message", [
    # a key the constructor does not take, with the closest names it takes
    (["+model.lable_smoothing=0.1"], r"model.lable_smoothing is not a setting of .*ImageClassifier. Did you mean "
                                     r"label_smoothing\? Remove it \(~model.lable_smoothing"),
    (["+trainer.max_epoch=3"], r"trainer.max_epoch is not a setting of lightning.pytorch.Trainer. Did you mean max_epochs"),
    # a network config's field, reached through the task's **kwargs
    (["model=gpt_char", "data=tinyshakespeare", "+model.n_layers=3"], r"model.n_layers .*Did you mean n_layer\?"),
    # the wrong type, against the constructor's hints (a library's too)
    (["trainer.max_epochs=abc"], r"trainer.max_epochs='abc' is refused: .*valid integer.*\(expected int >= -1 or None\)"),
    # through an interpolation: the key the user set is named
    (["seed=abc"], r"seed \(as data.seed\)='abc' is refused"),
    # a range declared on the parameter
    (["data.batch_size=0"], r"data.batch_size=0 is refused: .*\(expected int >= 1\)"),
    (["scheduler=cosine", "scheduler.warmup=-5"], r"scheduler.warmup=-5 is refused: .*\(expected float >= 0\)"),
    (["data.val_fraction=1.5"], r"data.val_fraction=1.5 is refused: .*\(expected float >= 0 and < 1\)"),
    # a relation to another setting, declared on the parameter (MultipleOf)
    (["model=gpt_char", "data=tinyshakespeare", "model.n_embd=100", "model.n_head=3"],
     r"model.n_embd=100 is refused: it must be a multiple of model.n_head=3"),
    (["model=mae", "data.image_size=30", "model.patch_size=4"],
     r"data.image_size \(as model.img_size\)=30 is refused: it must be a multiple of model.patch_size=4"),
    # a settings dict (TypedDict): its fields' ranges, and the keys it takes
    (["experiment=mt_transformer", "model.decode.beam_size=0"],
     r"model.decode.beam_size=0 is refused: input should be greater than or equal to 1 \(expected int >= 1 or None\)"),
    (["experiment=mt_transformer", "+model.decode.beam_sise=3"],
     r"model.decode.beam_sise is not one of its settings \(beam_size, .*\). Did you mean beam_size"),
    # a library's constructor without declared ranges: attnlab declares them where it builds it (TrainerRanges)
    (["trainer.accumulate_grad_batches=0"], r"trainer.accumulate_grad_batches=0 is refused: .*\(expected int >= 1\)"),
    # Literal choices, listed
    (["model=gpt_char", "data=tinyshakespeare", "model.positional=alibii"],
     r"model.positional='alibii' is refused: not one of the accepted values \(expected one of 'learned', "
     r"'sinusoidal', 'rope', 'alibi'\)"),
    # the library's own range checks, named by config key
    (["optimizer=sgd", "optimizer.momentum=0"], r"optimizer=sgd refuses its settings \(.*momentum=0.*\): Nesterov "
                                                r"momentum requires a momentum"),
    # ranges attnlab declares for torch's optimizers
    (["optimizer.lr=-1"], r"optimizer.lr=-1 is refused: input should be greater than or equal to 0"),
])
def test_a_bad_value_is_refused_before_anything_is_built(overrides, message, tmp_path):
    cfg = compose_cfg([*overrides, "debug=fdr", *FAST], tmp_path)
    with pytest.raises(UserError, match=message):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()


def test_every_problem_is_reported_at_once(tmp_path):
    cfg = compose_cfg(["trainer.max_epochs=abc", "data.batch_size=0", "+model.foo=1", *FAST], tmp_path)
    with pytest.raises(UserError) as err:
        train(cfg)
    assert all(k in str(err.value) for k in ("trainer.max_epochs", "data.batch_size", "model.foo"))


@pytest.mark.slow
def test_the_command_line_gets_one_paragraph_and_exit_code_2(tmp_path, log_env):
    out = run_here("train.py", "trainer.max_epochs=abc", env=log_env)
    assert out.returncode == 2 and "Traceback" not in out.stdout
    assert "attnlab: error: trainer.max_epochs='abc' is refused" in out.stdout


# ---- data that cannot be read, folders that cannot be written: named with the fix


def test_text_that_is_not_utf8_names_the_file_and_is_read_with_data_encoding(tmp_path):
    latin = tmp_path / "notes.txt"
    latin.write_bytes("Caf\u00e9 au lait, cr\u00e8me br\u00fbl\u00e9e.\n".encode("latin-1") * 200)
    base = ["model=gpt_char", "data=text", f"data.files=[{latin}]", "debug=fdr", *FAST]
    with pytest.raises(UserError, match=rf"{latin} is not utf-8 text .*data.encoding=latin-1 .*iconv -f latin1 -t "
                                        "utf-8 notes.txt"):
        train(compose_cfg(base, tmp_path / "run"))
    with pytest.raises(UserError, match=r"data.encoding='latin-2x' is refused: value error, not a text encoding"):
        train(compose_cfg([*base, "data.encoding=latin-2x"], tmp_path / "run"))
    cfg = compose_cfg([*base, "data.encoding=latin-1", "data.block_size=16"], tmp_path / "run")
    prepare(cfg)
    dm = build_datamodule(cfg.data)
    assert dm.tokenizer.token_to_id("\u00e9") is not None  # read as Latin-1: é is one character of the vocabulary


@pytest.mark.parametrize("layout, message", [
    ({"cat": 4}, r"holds one class \(cat\): a classifier needs two classes or more"),
    ({"cat": 4, "dog": 0}, r"class folder .*dog holds no images"),
])
def test_an_image_folder_with_one_or_an_empty_class_is_refused(tmp_path, layout, message):
    from PIL import Image

    for name, n in layout.items():
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / "images" / name / f"{i}.png")
    cfg = compose_cfg(["data=imagefolder", f"data.root={tmp_path / 'images'}", "debug=fdr", *FAST], tmp_path / "run")
    with pytest.raises(UserError, match=message):
        train(cfg)


def test_a_log_folder_under_a_file_is_refused_before_hydra_makes_the_run_directory(tmp_path):
    (tmp_path / "afile").write_text("")
    out = run_here("train.py", f"paths.log_dir={tmp_path / 'afile' / 'logs'}")
    assert out.returncode == 2 and "Traceback" not in out.stdout
    assert f"{tmp_path / 'afile'} is a file, not a folder" in out.stdout


def test_a_second_sigterm_or_one_during_a_long_step_stops_at_once_naming_the_last_checkpoint(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from attnlab.callbacks.signals import SignalGuard

    (tmp_path / "last.ckpt").write_bytes(b"saved")
    exits = []
    monkeypatch.setattr("os._exit", exits.append)
    guard = SignalGuard(patience_s=30)
    guard._trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(last_model_path=str(tmp_path / "last.ckpt")),
                                     callbacks=[], default_root_dir=str(tmp_path), world_size=1,
                                     _signal_connector=SimpleNamespace(received_sigterm=False))
    guard.step_started = time.monotonic()
    guard.on_sigterm(15, None)
    assert exits == []  # the first, mid-step: Lightning stops and saves after the step
    assert guard._trainer._signal_connector.received_sigterm
    guard.on_sigterm(15, None)
    assert exits == [143]

    late = SignalGuard(patience_s=30)
    late._trainer = guard._trainer
    late.step_started = time.monotonic() - 45  # a step running for 45 s
    late.on_sigterm(15, None)
    assert exits == [143, 143]

    # after SLURM's warning, the end it announced comes as two SIGTERMs (srun's and the step's): the warning's save
    # goes on; a step stuck past the patience still stops at once
    warned = SignalGuard(patience_s=30)
    warned._trainer, warned.warned = SimpleNamespace(**vars(guard._trainer)), 10
    warned._trainer._signal_connector = SimpleNamespace(received_sigterm=False)
    warned.step_started = time.monotonic()
    warned.on_sigterm(15, None)
    warned.on_sigterm(15, None)
    assert exits == [143, 143] and warned.received == 0 and not warned._trainer._signal_connector.received_sigterm
    warned.step_started = time.monotonic() - 45
    warned.on_sigterm(15, None)
    assert exits == [143, 143, 143]


def test_ckpt_path_refuses_a_checkpoint_of_another_optimizer_or_network_size(tmp_path):
    short = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "test=false",
             *FAST]
    train(compose_cfg(["optimizer=sgd", *short], tmp_path / "sgd"))
    last = tmp_path / "sgd" / "checkpoints" / "last.ckpt"
    with pytest.raises(UserError, match=r"trained with optimizer torch.optim.SGD, whose state cannot continue in this "
                                        r"run's torch.optim.AdamW"):
        train(compose_cfg([f"ckpt_path={last}", *short], tmp_path / "adamw"))
    with pytest.raises(UserError, match=r"holds a network of other sizes than this run builds \(net\..*in the "
                                        r"checkpoint"):
        train(compose_cfg(["optimizer=sgd", "+model.backbone_kwargs.embed_dim=64", f"ckpt_path={last}", *short],
                          tmp_path / "wider"))


@pytest.mark.parametrize("config_name, overrides, message", [
    ("train", ["global_batch_size=0"], r"global_batch_size=0 is refused: .*\(expected int >= 1 or None\)"),
    # torch takes them, and the run goes to NaN: averaging factors are in [0, 1)
    ("train", ["optimizer=sgd", "optimizer.momentum=2"],
     r"optimizer.momentum=2 is refused: input should be less than 1 \(expected float >= 0 and < 1\)"),
    ("train", ["optimizer.betas=[0.9,1.5]"], r"optimizer.betas\[1\]=1.5 is refused: .*\(expected float >= 0 and < 1\)"),
    ("train", ["optimizer=sgd", "+optimizer.dampening=-0.5"], r"optimizer.dampening=-0.5 is refused"),
    ("train", ["model=bert_small", "data=text"], r"data.objective \(as model.objective\)='causal' is refused: .* Add "
                                               r"data.objective=masked to the command line \(model.objective reads it\)"),
    ("train", ["train=maybe"], r"train='maybe' is refused: .*\(expected bool\)"),
    ("eval", ["ckpt_path=x.ckpt", "split=train"], r"split='train' is refused: not one of the accepted values "
                                                  r"\(expected one of 'test', 'val'\)"),
    ("eval", ["ckpt_path=x.ckpt", "trainer.limit_test_batches=abc"], r"trainer.limit_test_batches='abc' is refused"),
])
def test_the_entry_configs_own_keys_are_checked_the_same_way(config_name, overrides, message, tmp_path):
    cfg = compose_cfg(overrides, tmp_path, config_name=config_name)
    prepare(cfg)
    with pytest.raises(UserError, match=message):
        check_config(cfg)


def test_a_group_set_to_null_on_the_command_line_removes_it(tmp_path):
    from attnlab.cli.app import null_groups

    argv = null_groups(["logger=null", "callbacks=none", "trainer.devices=null", "launcher=null"], CONF_DIR)
    # Hydra's spelling for groups; keys, and a group's own option named none (callbacks/none.yaml), stay
    assert argv == ["~logger", "callbacks=none", "trainer.devices=null", "~launcher"]
    cfg = compose_cfg(argv[:1], tmp_path)
    assert "logger" not in cfg
