"""Language-model runs through the same `train(cfg)` as train.py: every LM experiment, a short real GPT run on
Tiny Shakespeare, prediction from a checkpoint, and the errors a user can make. Everything but the learning run reads
the small play-like corpus of tests/fixtures.py."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.cli.predict import predictor_for
from attnlab.cli.training import train
from attnlab.errors import UserError
from attnlab.tasks.language_model import MaskedLM
from conftest import FAST, compose_cfg, real_data, run_here

SMALL = ["model.num_samples=1", *FAST]
GPT = ["model.sample_tokens=20"]


@pytest.mark.parametrize("experiment,extra", [
    ("gpt_shakespeare_char_cpu", GPT),
    ("gpt_shakespeare_char", ["data.batch_size=4", *GPT]),
    ("bert_shakespeare", ["data.batch_size=8"]),
])
@pytest.mark.slow
def test_fast_dev_run_of_each_lm_experiment(tmp_path, small_data, experiment, extra):
    cfg = compose_cfg([f"experiment={experiment}", "debug=fdr", *extra, *SMALL], tmp_path, data_dir=small_data)
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["val/loss"] > 0
    # no test split of its own: the test results say they are the validation split's (nanoGPT's recipe tests not)
    assert metrics.get("test_is_validation") is (True if cfg.test else None), metrics
    if experiment == "bert_shakespeare":
        assert 0 <= metrics["val/acc"] <= 1


def test_gpt2_owt_needs_the_hub_and_says_so(tmp_path, hub_offline):
    cfg = compose_cfg(["experiment=gpt2_owt", "debug=fdr", "model.n_layer=1", "model.compile=false",
                       "data.num_workers=0", *GPT, *SMALL], tmp_path)
    # offline, GPT-2's tokenizer (the first thing the data needs from the hub) cannot be fetched
    with pytest.raises(UserError, match="could not load the pretrained tokenizer 'gpt2'.*go online once"):
        train(cfg)


def test_gpt2_owt_recipe_runs_a_fast_dev_run_on_cpu_with_local_text(tmp_path, small_data):
    """The recipe's optimizer, schedule, accumulation and clipping, with a tiny model on local text and the CPU."""
    cfg = compose_cfg(["experiment=gpt2_owt", "debug=fdr", "trainer.accelerator=cpu", "trainer.precision=32-true",
                       "model.compile=false", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
                       "data.block_size=32", "data.batch_size=2", "data.num_workers=0", "data.hub=null",
                       f"data.files=[{small_data}/tinyshakespeare/input.txt]", "data.tokenizer=bpe",
                       "data.tokenizer_vocab_size=300", *GPT, *SMALL], tmp_path)
    assert cfg.trainer.accumulate_grad_batches == 40 and cfg.optimizer.betas == [0.9, 0.95]
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["val/loss"] > 0 and metrics["test_is_validation"] is True  # no test split: said with the results


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path, small_data):
    cfg = compose_cfg(["experiment=gpt_shakespeare_char_cpu", "debug=fdr", "model.vocab_size=50", *GPT, *SMALL], tmp_path,
                      data_dir=small_data)  # Tiny Shakespeare's 65 characters
    with pytest.raises(UserError, match=r"tokenizer has 65 tokens but .*model.vocab_size=50.*model.vocab_size>=65"):
        train(cfg)


def test_block_size_longer_than_the_positional_table(tmp_path, small_data):
    cfg = compose_cfg(["experiment=gpt_shakespeare_char_cpu", "debug=fdr", "model.block_size=32", *GPT, *SMALL], tmp_path,
                      data_dir=small_data)
    with pytest.raises(UserError, match=r"64 tokens is longer than .*model.block_size=32.*data.block_size"):
        train(cfg)


@pytest.fixture(scope="module")
def trained_gpt(tmp_path_factory):
    """200 steps of the CPU recipe (warmup 20) on Tiny Shakespeare: val loss goes from 4.17 (uniform over 65
    characters) to ~2.44."""
    real_data("tinyshakespeare")
    out = tmp_path_factory.mktemp("gpt")
    cfg = compose_cfg(["experiment=gpt_shakespeare_char_cpu", "trainer.max_steps=200",
                       "trainer.val_check_interval=200", "trainer.limit_val_batches=10", "scheduler.warmup=20",
                       "test=false", "logger=csv", *GPT, *SMALL], out)
    train(cfg)
    return out


@pytest.fixture(scope="module")
def small_gpt(tmp_path_factory, small_data):
    """A checkpoint of the CPU recipe (a smaller GPT, 40 steps) on the small play-like corpus."""
    out = tmp_path_factory.mktemp("small_gpt")
    cfg = compose_cfg(["experiment=gpt_shakespeare_char_cpu", "model.n_layer=2", "model.n_embd=64",
                       "trainer.max_steps=40", "trainer.val_check_interval=40", "trainer.limit_val_batches=2",
                       "scheduler.warmup=5", "test=false", "logger=csv", *GPT, *SMALL], out, data_dir=small_data)
    train(cfg)
    return out


@pytest.mark.slow
def test_short_gpt_run_learns_shakespeare(trained_gpt):
    metrics = json.loads((trained_gpt / "metrics.json").read_text())
    assert metrics["val/loss"] < 2.6  # a character unigram model scores ~3.3
    assert abs(metrics["val/ppl"] - torch.tensor(metrics["val/loss"]).exp().item()) < 1e-3
    import pandas as pd

    df = pd.read_csv(trained_gpt / "csv" / "metrics.csv")
    assert df["perf/tokens_per_s"].dropna().gt(0).all() and df["perf/mfu"].dropna().gt(0).all()
    assert df["train/loss"].dropna().iloc[-1] < df["train/loss"].dropna().iloc[0] - 1.0


@pytest.mark.slow
def test_predict_streams_text_from_the_checkpoint(small_gpt, log_env):
    ckpt = small_gpt / "checkpoints" / "last.ckpt"
    out = run_here("predict.py", f"ckpt_path={ckpt}", "prompt=ROMEO:", "max_new_tokens=80", "temperature=0.8",
                   "top_k=200", "extras.print_config=false", env=log_env | {"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:]
    text = out.stdout.split("ROMEO:", 1)[1].split("---------------")[0]
    assert len(text) >= 60 and sum(c.isalpha() for c in text) > 30
    bad = run_here("predict.py", f"ckpt_path={ckpt}", 'prompt="ROMEO: é"', "extras.print_config=false", env=log_env)
    assert bad.returncode == 2
    assert "does not know: 'é'" in bad.stdout and "prompt=" in bad.stdout


def test_masked_lm_predict_prints_top_fills(capsys):
    from attnlab.data.text.tokenizers import MLM_SPECIALS, CharTokenizer

    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyzT ", MLM_SPECIALS)
    model = MaskedLM(vocab_size=tok.vocab_size, max_length=32, n_layer=1, n_head=2, n_embd=16,
                     tokenizer=tok.to_json()).eval()
    fills = predictor_for(type(model))(model, OmegaConf.create({"text": "The [MASK]at", "top_k": 3}), None)
    assert len(fills) == 1 and len(fills[0]) == 3
    printed = capsys.readouterr().out
    assert "[MASK] #1: 1." in printed and "filled: The " in printed
    with pytest.raises(UserError, match=r"needs text=.*\[MASK\]"):
        predictor_for(type(model))(model, OmegaConf.create({"text": "no mask here"}), None)


class WandbLogger:  # what the tasks look for (by name) to log media; records the payloads
    def __init__(self):
        self.experiment, self.logged = self, []

    def log(self, payload):
        self.logged.append(payload)


class _Trainer:
    global_step, is_global_zero, sanity_checking = 7, True, False

    def __init__(self):
        self.loggers = [WandbLogger()]


def test_generated_samples_go_to_a_wandb_table():
    from attnlab.data.text.tokenizers import CharTokenizer
    from attnlab.tasks.language_model import CausalLM

    tok = CharTokenizer("abcdefgh \n")
    model = CausalLM(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16, num_samples=2,
                     sample_tokens=10, sample_prompt="ab", tokenizer=tok.to_json())
    model._trainer = _Trainer()
    model.log_samples()
    (payload,) = model._trainer.loggers[0].logged
    table = payload["val/samples"]
    assert table.columns == ["step", "prompt", "text"] and len(table.data) == 2
    assert all(row[0] == 7 and row[2].startswith("ab") and len(row[2]) == 12 for row in table.data)
    assert table.data[0][2] != table.data[1][2]                      # two samples drawn, not one repeated


def test_samples_at_every_nth_validation_and_the_last():
    from attnlab.data.text.tokenizers import CharTokenizer
    from attnlab.tasks.language_model import CausalLM

    tok = CharTokenizer("abcdefgh \n")
    model = CausalLM(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16, num_samples=1,
                     sample_tokens=3, sample_every=3, tokenizer=tok.to_json())
    model._trainer = _Trainer()
    model._trainer.max_steps = 100                                   # global_step 7: not the last validation
    for _ in range(4):
        model.log_samples()
    assert len(model._trainer.loggers[0].logged) == 1                # the 3rd of 4 validations
    model._trainer.max_steps = 7                                     # the last validation of training samples too
    model.log_samples()
    assert len(model._trainer.loggers[0].logged) == 2


def test_a_prompt_the_tokenizer_cannot_encode_falls_back_to_the_data(caplog):
    from attnlab.data.text.tokenizers import CharTokenizer
    from attnlab.tasks.language_model import CausalLM

    tok = CharTokenizer("abcdefgh ")                                 # a corpus without newlines
    model = CausalLM(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16, num_samples=1,
                     sample_tokens=5, tokenizer=tok.to_json())      # the default sample_prompt is "\n"
    model._trainer = _Trainer()
    model._first_val_ids = torch.tensor([[2]])
    model.log_samples()                                             # a validation must not end the run
    (payload,) = model._trainer.loggers[0].logged
    assert len(payload["val/samples"].data[0][2]) == 6 and "model.sample_prompt" in caplog.text
    texts = predictor_for(type(model))(model, OmegaConf.create({"max_new_tokens": 0, "num_samples": 2}), None)
    assert texts == ["", ""]                                        # 0 is a value: no new tokens, two samples
    with pytest.raises(UserError, match='a GPT checkpoint continues a prompt: give prompt="..."'):
        predictor_for(type(model))(model, OmegaConf.create({"input": "images/"}), None)


def test_masked_lm_text_longer_than_the_model_says_shorten_it():
    from attnlab.data.text.tokenizers import MLM_SPECIALS, CharTokenizer

    tok = CharTokenizer("abc ", MLM_SPECIALS)
    model = MaskedLM(vocab_size=tok.vocab_size, max_length=8, n_layer=1, n_head=2, n_embd=16, tokenizer=tok.to_json())
    with pytest.raises(UserError, match=r"text= is 14 tokens .* at most 8 \(model.max_length\): give a shorter text"):
        predictor_for(type(model))(model, OmegaConf.create({"text": "abc [MASK] abcabc"}), None)


@pytest.mark.parametrize("experiment,objective,wanted", [("gpt_shakespeare_char_cpu", "masked", "causal"),
                                                         ("bert_shakespeare", "causal", "masked")])
def test_data_objective_against_the_model_is_a_user_error(tmp_path, small_data, experiment, objective, wanted):
    from attnlab.cli.checks import check_config

    cfg = compose_cfg([f"experiment={experiment}", "debug=fdr", f"data.objective={objective}", "data.batch_size=4",
                       *SMALL], tmp_path, data_dir=small_data)
    with pytest.raises(UserError, match=rf"data.objective \(as model.objective\)='{objective}' is refused: .*"
                                        f"expected one of '{wanted}'"):
        check_config(cfg)


@pytest.mark.slow
def test_eval_on_other_text_reads_it_with_the_checkpoints_vocabulary(small_gpt, small_data, tmp_path, log_env):
    """Other text, whose own characters would make another vocabulary, is read with the checkpoint's tokenizer and
    evaluated; a character that vocabulary lacks is named in one paragraph."""
    text = tmp_path / "other.txt"
    text.write_text("all work and no play makes jack a dull boy\n" * 400)  # fewer characters than Shakespeare's
    ckpt = small_gpt / "checkpoints" / "last.ckpt"
    out = run_here("eval.py", f"ckpt_path={ckpt}", f"+data.files=[{text}]", "extras.print_config=false",
                   f"hydra.run.dir={tmp_path}/eval", env=log_env, data_dir=small_data)
    assert out.returncode == 0, out.stdout[-2000:]
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["test/loss"] > 0
    text.write_text("all work and no play makes jack a dull boy \u20ac\n" * 400)
    out = run_here("eval.py", f"ckpt_path={ckpt}", f"+data.files=[{text}]", "extras.print_config=false", env=log_env,
                   data_dir=small_data)
    assert out.returncode == 2 and "characters the character tokenizer does not know: '\u20ac'" in out.stdout, \
        out.stdout[-2000:]
