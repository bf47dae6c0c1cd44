"""Typed checks of the composed config (attnlab.cli.checks): one general mechanism against the constructors'
signatures, type hints and declared ranges. Each kind of mistake is covered once here, through that mechanism."""

from __future__ import annotations

import pytest

from attnlab.cli.checks import check_config
from attnlab.cli.training import train
from attnlab.config import CONF_DIR, prepare
from attnlab.errors import UserError
from conftest import FAST, compose_cfg, run_cli

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
MODELS = {"gpt_char": "tinyshakespeare", "bert_small": "tinyshakespeare", "transformer_seq2seq_small": "multi30k",
          "rnn_seq2seq": "multi30k", "unet": "membrane", "segmentation": "membrane", "mae": "digits",
          "swin": "digits", "resnet50": "digits"}


@pytest.mark.parametrize("overrides", [[f"experiment={e}"] for e in EXPERIMENTS]
                         + [[f"model={m}", f"data={d}"] for m, d in MODELS.items()], ids=str)
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
    (["trainer.max_epochs=abc"], r"trainer.max_epochs='abc' is refused: .*valid integer.*\(expected int or None\)"),
    # through an interpolation: the key the user set is named
    (["seed=abc"], r"seed \(as data.seed\)='abc' is refused"),
    # a range declared on the parameter
    (["data.batch_size=0"], r"data.batch_size=0 is refused: .*\(expected int >= 1\)"),
    (["scheduler=cosine", "scheduler.warmup=-5"], r"scheduler.warmup=-5 is refused: .*\(expected float >= 0\)"),
    (["data.val_fraction=1.5"], r"data.val_fraction=1.5 is refused: .*\(expected float >= 0 and < 1\)"),
    # Literal choices, listed
    (["model=gpt_char", "data=tinyshakespeare", "model.positional=alibii"],
     r"model.positional='alibii' is refused: not one of the accepted values \(expected one of 'learned', "
     r"'sinusoidal', 'rope', 'alibi'\)"),
    # the library's own range checks, named by config key
    (["optimizer.lr=-1"], r"optimizer=adamw refuses its settings \(lr=-1, .*Invalid learning rate"),
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


def test_the_command_line_gets_one_paragraph_and_exit_code_2(tmp_path, log_env):
    out = run_cli("train.py", "trainer.max_epochs=abc", env=log_env)
    assert out.returncode == 2 and "Traceback" not in out.stdout
    assert "attnlab: error: trainer.max_epochs='abc' is refused" in out.stdout
