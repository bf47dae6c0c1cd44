"""The memory estimate of a training step (attnlab.memory): runs too large for the machine are refused before they
start, the estimate leaves the run as it would have been without it, and its accuracy (benchmarks/memory_estimate.py,
run through the README)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

import attnlab.memory as memory
from attnlab.cli import builders
from attnlab.cli.plan import make_plan
from attnlab.cli.training import train
from attnlab.config import prepare
from attnlab.errors import UserError
from conftest import FAST, compose_cfg

GPT_SMALL = ["model=gpt_char", "data=tinyshakespeare", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
             "data.batch_size=8"]


def test_a_run_too_large_for_the_machine_is_refused_naming_the_setting(small_data, tmp_path):
    # nanoGPT's char model on windows of 2,000 characters, 256 a batch: the T^2 attention of the math kernel (dropout is on)
    cfg = compose_cfg(["model=gpt_char", "data=tinyshakespeare", "data.block_size=2000", "data.batch_size=256", *FAST], tmp_path,
                      data_dir=small_data)
    with pytest.raises(UserError) as err:
        train(cfg)
    msg = str(err.value)
    assert "more than 90% of this machine's available memory" in msg
    assert "the largest part is activations" in msg
    assert "data.block_size (now 2000)" in msg and "data.batch_size (now 256)" in msg
    assert "max_length" not in msg  # a data setting that is not a dimension of this task's batches
    assert "extras.force=true" in msg
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "config.yaml").exists()


def test_force_starts_a_refused_run(small_data, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(memory, "_available", lambda on_gpu, processes: 1024)  # a machine with 1 kB free
    overrides = [*GPT_SMALL, "trainer.max_steps=2", "test=false", *FAST]
    with pytest.raises(UserError, match=r"the largest part is process .* To fit: the data held in memory"):
        train(compose_cfg(overrides, tmp_path / "a", data_dir=small_data))
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        train(compose_cfg([*overrides, "extras.force=true"], tmp_path / "b", data_dir=small_data))
    assert "starting anyway: extras.force=true" in caplog.text
    assert (tmp_path / "b" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("overrides", [
    ["model=vit", "data=digits", "model.drop_path_rate=0.1"],       # fake tensors; timm; stochastic depth
    ["model=unet", "data=membrane", "data.batch_size=2"],            # batch norm: its statistics must not move
    ["model=bert_small", "data=tinyshakespeare", "data.objective=masked", "data.batch_size=4", "model.n_layer=1"],  # the masked positions gathered
], ids=["vit", "unet", "bert"])
def test_the_estimate_leaves_the_run_as_it_was(overrides, small_data, tmp_path):
    cfg = compose_cfg([*overrides, *FAST, f"paths.cache_dir={tmp_path / 'cache'}"], tmp_path, data_dir=small_data)
    prepare(cfg)  # a cache of its own: the step is traced, not read from an earlier test's estimate
    torch.manual_seed(0)
    dm = builders.build_datamodule(cfg.data)
    task = builders.build_task(cfg, dm)
    state = {k: v.clone() for k, v in task.state_dict().items()}
    rng = torch.get_rng_state()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    est = memory.check_run_memory(make_plan(cfg), task, dm, data=resolved["data"])
    assert est is not None and est.terms["activations"] > 0 and est.total > est.terms["process"]
    assert torch.equal(torch.get_rng_state(), rng)  # the run draws the same numbers
    after = task.state_dict()
    assert [k for k in state if not torch.equal(state[k], after[k])] == []  # weights, batch-norm statistics, metric states
    assert all(p.grad is None for p in task.parameters())


def test_activations_follow_the_batch_and_the_attention_kernel(small_data, tmp_path):
    """Linear in the batch; quadratic in T only where SDPA takes its math path (dropout in training)."""
    def act(*extra):
        cfg = compose_cfg([*GPT_SMALL, *extra, *FAST], tmp_path, data_dir=small_data)
        prepare(cfg)
        dm = builders.build_datamodule(cfg.data)
        task = builders.build_task(cfg, dm)
        return memory.activation_bytes(task, memory.sample_batch(dm))

    base = act("data.block_size=64", "model.dropout=0.0")
    assert act("data.block_size=64", "model.dropout=0.0", "data.batch_size=16") == pytest.approx(2 * base, rel=0.1)
    fused, math_path = act("data.block_size=256", "model.dropout=0.0"), act("data.block_size=256", "model.dropout=0.1")
    assert fused < 5 * base  # linear in T with the fused kernel
    assert math_path > 2 * fused  # the B x H x T^2 scores, their softmax and dropout mask


def test_a_traced_step_is_kept_and_read_back_only_for_the_same_network_and_batch(small_data, tmp_path, monkeypatch):
    traced = []
    real = memory.activation_bytes
    monkeypatch.setattr(memory, "activation_bytes", lambda *a: traced.append(1) or real(*a))

    def estimate(*extra):
        cfg = compose_cfg([*GPT_SMALL, *extra, *FAST], tmp_path, data_dir=small_data)
        prepare(cfg)
        dm = builders.build_datamodule(cfg.data)
        return memory.estimate(builders.build_task(cfg, dm), dm, {}, cache_dir=str(tmp_path / "cache"))

    first = estimate().terms["activations"]
    assert estimate().terms["activations"] == first and len(traced) == 1  # read back
    assert estimate("optimizer.lr=0.5").terms["activations"] == first and len(traced) == 1  # a sweep's jobs
    assert len(list((tmp_path / "cache" / "memory").glob("*.json"))) == 1
    wider = estimate("model.n_embd=64").terms["activations"]
    shorter = estimate("data.block_size=128").terms["activations"]
    no_dropout = estimate("model.dropout=0.0").terms["activations"]
    assert len(traced) == 4 and wider > first and shorter < first and no_dropout < first  # each another key
    (tmp_path / "cache" / "memory").chmod(0o500)  # a read-only cache: traced, not refused
    try:
        assert estimate("model.n_head=4").terms["activations"] > 0 and len(traced) == 5
    finally:
        (tmp_path / "cache" / "memory").chmod(0o700)


def test_the_limits_per_process_and_on_a_gpu(monkeypatch):
    monkeypatch.setattr(memory, "mem_available", lambda: 10 * memory.GiB)
    monkeypatch.setattr(memory, "process_rss", lambda: 0)
    assert memory._available(False, 2) == pytest.approx(memory._available(False, 1) / 2)  # DDP's local processes
    est = memory.MemoryEstimate(device="GPU", terms={"weights": 2 * memory.GiB, "gradients": 2 * memory.GiB,
                                                     "optimizer state": 4 * memory.GiB, "activations": memory.GiB},
                                available=6 * memory.GiB)
    with pytest.raises(UserError, match=r"more than 90% of the free memory of the GPU .* largest part is optimizer "
                                        r"state .*trainer=fsdp"):
        memory.check_fits(est, {"batch_size": 8})


# ---- memory flat in corpus size: a generated corpus of a few hundred MB against 1 MB, each process's own peak RSS

CORPUS_MB = 200
FLAT = ["model=gpt_char", "data=text", "data.name=generated", "data.tokenizer=char", "model.n_layer=1",
        "model.n_head=2", "model.n_embd=32", "data.block_size=64", "data.batch_size=8", "data.num_workers=0",
        "trainer.max_steps=20", "trainer.max_epochs=-1", "trainer.limit_val_batches=2",
        "trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=20", "test=false", "logger=csv",
        "model.sample_tokens=0", "extras.print_config=false", "callbacks.progress_bar=null"]


def _corpus(path, megabytes: int):
    """Lines of random words over 40 characters, 1 MB of them repeated `megabytes` times."""
    import numpy as np

    rng = np.random.default_rng(0)
    chars = np.array(list("abcdefghijklmnopqrstuvwxyz     ,.;:!?ABCDE"))
    block = "".join(chars[rng.integers(0, len(chars), 1 << 20)])
    block = "\n".join(block[i:i + 60] for i in range(0, len(block), 60)) + "\n"
    with open(path, "w") as f:
        for _ in range(megabytes):
            f.write(block)
    return path


def _peak_gib(out: str) -> float:
    import re

    m = re.search(r"peak memory \(CPU\)\s+([\d.]+) GiB", out)
    assert m, out[-3000:]
    return float(m.group(1))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_training_memory_is_flat_in_corpus_size_and_tokenizing_is_bounded(tmp_path, log_env):
    from conftest import run_cli

    def run(corpus) -> float:
        out = run_cli("train.py", *FLAT, f"data.files=[{corpus}]", env=log_env, own_peak_memory=True)
        assert out.returncode == 0, out.stdout[-3000:]
        return _peak_gib(out.stdout)

    small = run(_corpus(tmp_path / "small.txt", 1))
    large = _corpus(tmp_path / "large.txt", CORPUS_MB)
    tokenizing = run(large)  # tokenizes the 200 MB into the cache, then trains
    cached = run(large)      # reads the cached tokens
    print(f"peak RSS: 1 MB {small:.3f} GiB; {CORPUS_MB} MB tokenizing {tokenizing:.3f} GiB, cached {cached:.3f} GiB")
    # training: flat in the corpus (before: +0.3 GB at 400 MB from a Python list per epoch, then +0.07 GiB at 200 MB
    # from the token file's pages mapped into the process by random windows); measured +10 MiB (+20 tokenizing)
    assert cached - small < 50 / 1024, (small, cached)
    assert tokenizing - small < 150 / 1024, (small, tokenizing)  # tokenizing: bounded by a chunk, not the corpus


@pytest.mark.slow
def test_the_reported_cpu_peak_is_the_runs_own_not_its_parents():
    """A train.py started by a large process (a notebook) reports its own peak memory: on Linux ru_maxrss counts the
    parent's memory up to the exec, so it is read from VmHWM."""
    child = ("import resource, torch; from attnlab.memory import peak_rss; "  # what report.peak_memory reads on CPU
             "print(peak_rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    parent = (f"import subprocess, sys; x = bytearray(1536 << 20); x[::4096] = b'1' * len(x[::4096]); "
              f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True).stdout)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120)
    own, ru_maxrss = map(int, out.stdout.split())
    assert own < 1 << 30, f"reported {own / 2**20:.0f} MiB: the parent's 1.5 GiB counted"
    if sys.platform == "linux":
        assert ru_maxrss > 1536 << 20  # what the report would be without VmHWM


def test_lazy_modules_of_a_users_lightning_module_are_estimated_not_a_crash():
    """A LightningModule written with nn.LazyLinear (as lightning-hydra-template users write theirs): the estimate
    gives the lazy layers their parameters with one real step and counts them; the weights are real tensors after
    it, so the optimizer the run builds next sees them."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Lazy(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.LazyLinear(64), torch.nn.ReLU(), torch.nn.LazyLinear(3))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(32, 20), torch.randint(0, 3, (32,))), batch_size=8)

    task = Lazy()
    est = memory.estimate(task, Data(), {"precision": "32-true"})
    weights = (20 * 64 + 64 + 64 * 3 + 3) * 4
    assert est is not None and est.terms["gradients"] == weights and est.terms["activations"] > 0
    assert not any(torch.nn.parameter.is_lazy(p) for p in task.parameters())
    assert all(type(p) is torch.nn.Parameter for p in task.parameters())  # real, not fake tensors


def test_an_estimate_that_fails_is_one_line_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("an op the trace cannot run\nwith a second line")

    monkeypatch.setattr(memory, "estimate", broken)
    cfg = compose_cfg(["trainer.max_steps=2", "trainer.limit_val_batches=1", "test=false", "logger=csv",
                       "callbacks.model_checkpoint=null", *FAST], tmp_path)
    with caplog.at_level("WARNING", logger="attnlab"):
        train(cfg)
    assert "memory: no estimate for this run (RuntimeError: an op the trace cannot run); it goes on" in caplog.text
    assert "second line" not in caplog.text
