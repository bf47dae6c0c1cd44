"""Optimizer param groups and learning-rate schedules."""

from __future__ import annotations

import pytest
import timm
import torch

import attnlab.nn.timm_compact  # noqa: F401
from attnlab.optim import schedulers
from attnlab.optim.param_groups import param_groups


def test_no_decay_on_bias_norm_embeddings_and_model_hooks():
    net = timm.create_model("vit_compact", img_size=8, in_chans=1, num_classes=10, class_token=True,
                            global_pool="token")
    decay, no_decay = param_groups(net, 0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "norm.bias", "blocks.0.attn.qkv.bias"} <= no_decay_names
    assert {"blocks.0.attn.qkv.weight", "head.weight", "patch_embed.proj.weight"} <= decay_names
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(net.parameters()))


def test_embedding_tables_are_not_decayed():
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4))
    decay, no_decay = param_groups(net, 0.1)
    assert net[0].weight in no_decay["params"] and net[1].weight in decay["params"]


def _lrs(make, steps=100, **kw):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make(opt, total_steps=steps, **kw)["scheduler"]
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("make", [schedulers.cosine, schedulers.linear])
def test_warmup_then_decay(make):
    lrs = _lrs(make, warmup=0.1, min_lr_ratio=0.1)
    assert lrs[0] < lrs[5] < lrs[10]  # warming up over 10 steps
    assert lrs[10] == pytest.approx(1.0, abs=0.02)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decaying
    assert lrs[-1] == pytest.approx(0.1, abs=0.02)


def test_constant_and_onecycle():
    assert _lrs(schedulers.constant, warmup=0)[-1] == 1.0
    lrs = _lrs(schedulers.onecycle)
    assert max(lrs) == pytest.approx(1.0, abs=1e-3) and lrs[0] == pytest.approx(1 / 25, rel=1e-3)
    assert lrs.index(max(lrs)) in range(28, 32) and lrs[-1] < 1e-3


def test_noam_matches_the_paper():
    lrs = _lrs(schedulers.noam, steps=50, d_model=512, warmup=10)
    peak = 512 ** -0.5 * 10 ** -0.5
    assert max(lrs) == pytest.approx(peak, rel=1e-6) and lrs.index(max(lrs)) == 9


def test_plateau_warmup_leaves_plateau_in_charge():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    warm, plateau = schedulers.plateau(opt, total_steps=100, warmup=4, patience=0, factor=0.5, mode="min")
    for _ in range(6):
        warm["scheduler"].step()
    assert opt.param_groups[0]["lr"] == 1.0
    plateau["scheduler"].step(1.0)
    plateau["scheduler"].step(2.0)  # no improvement: halve
    warm["scheduler"].step()
    assert opt.param_groups[0]["lr"] == 0.5


def test_global_batch_size_sets_gradient_accumulation():
    from attnlab.cli.plan import accumulation_for
    from attnlab.errors import UserError

    assert accumulation_for(512, 64, 4, 1) == 2
    assert accumulation_for(480, 12, 8, 5) == 1
    with pytest.raises(UserError, match="global_batch_size=100 is not a multiple of .* = 64"):
        accumulation_for(100, 32, 2, 1)


@pytest.mark.parametrize("options, fused", [({}, True), ({"foreach": True}, None), ({"fused": False}, False)])
def test_adamw_is_fused_on_the_cpu_unless_the_config_says_otherwise(options, fused):
    """torch's fused AdamW is one kernel for the whole update: about 5x faster than the per-tensor loop on CPU for
    a small ViT's 55 tensors, and on CUDA; an explicit `foreach` or `fused` in the config is kept."""
    from omegaconf import OmegaConf

    from attnlab.tasks.base import _CPU_FUSED
    from attnlab.tasks.classification import ImageClassifier

    optimizer = OmegaConf.create({"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, **options})
    task = ImageClassifier(net="timm", backbone="vit_compact", num_classes=10, img_size=8, in_chans=1,
                           optimizer=optimizer, scheduler=None)
    opt = task.configure_optimizers()
    assert opt.defaults["fused"] == (fused if _CPU_FUSED or fused is not True else None)
    loss = task(torch.randn(4, 1, 8, 8)).logsumexp(-1).mean()
    loss.backward()
    before = [p.detach().clone() for p in task.parameters()]
    opt.step()  # runs on the CPU, and moves every parameter
    assert all(not torch.equal(b, p) for b, p in zip(before, task.parameters()))
