"""DDP on 2 CPU processes (gloo) optimizes exactly like one process with the same global batch; FSDP wraps each
block the network declares; activation checkpointing changes no number."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as dist

from attnlab.cli.plan import make_plan
from attnlab.errors import UserError
from conftest import compose_cfg, run_cli

COMMON = ["trainer.max_epochs=2", "data.augment=null", "test=false", "extras.print_config=false",
          "callbacks.progress_bar=null", "trainer.limit_train_batches=12"]


@pytest.mark.slow
def test_ddp_cpu_matches_one_process_with_the_same_global_batch(tmp_path, log_env):
    single = run_cli("train.py", *COMMON, "data.batch_size=32", "trainer.limit_train_batches=12",
                     f"hydra.run.dir={tmp_path}/single", env=log_env)
    assert single.returncode == 0, single.stdout[-3000:]
    # with each ViT block's activations recomputed in the backward pass, which changes no number
    ddp = run_cli("train.py", *COMMON, "trainer=ddp_cpu", "data.batch_size=16", f"hydra.run.dir={tmp_path}/ddp",
                  "model.activation_checkpointing=true", env=log_env)
    assert ddp.returncode == 0, ddp.stdout[-3000:]
    assert "activation checkpointing: 4 blocks (Block)" in ddp.stdout
    one = json.loads((tmp_path / "single" / "metrics.json").read_text())
    two = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    # each global step sees the same 32 samples, split 16 + 16 across the ranks; gradients are averaged
    assert two["val/loss"] == pytest.approx(one["val/loss"], abs=2e-3)
    assert two["val/acc"] == pytest.approx(one["val/acc"], abs=1 / 180 + 1e-6)


def _tasks() -> dict:
    """A small task of each network family, built as train.py builds them (model.net and its settings)."""
    from attnlab.tasks.classification import ImageClassifier
    from attnlab.tasks.language_model import CausalLM, MaskedLM
    from attnlab.tasks.mae import MAEPretrainer
    from attnlab.tasks.translation import Translator

    lm = dict(n_layer=2, n_head=2, n_embd=16, dropout=0.1)
    swin = dict(embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4)
    return {
        "gpt": CausalLM(vocab_size=17, block_size=8, **lm),
        "bert": MaskedLM(vocab_size=17, max_length=8, **lm),
        "transformer_seq2seq": Translator(net="transformer_seq2seq", src_vocab_size=17, tgt_vocab_size=17,
                                          ffn_hidden=32, **lm),
        "mae": MAEPretrainer(img_size=16, patch_size=4, in_chans=1, embed_dim=16, depth=2, num_heads=2,
                             decoder_dim=16, decoder_depth=1, decoder_heads=2),
        "vit": ImageClassifier(num_classes=10, img_size=8, in_chans=1, drop_path_rate=0.1),
        "swin": ImageClassifier(backbone="swin_tiny_patch4_window7_224", num_classes=10, img_size=32, in_chans=1,
                                backbone_kwargs=swin),
    }


def _blocks() -> dict:
    from timm.models.swin_transformer import SwinTransformerBlock
    from timm.models.vision_transformer import Block as TimmBlock

    from attnlab.nn.layers import Block

    return {"gpt": Block, "bert": Block, "transformer_seq2seq": Block, "mae": TimmBlock, "vit": TimmBlock,
            "swin": SwinTransformerBlock}


def test_fsdp_wraps_the_blocks_each_network_declares(tmp_path):
    """FSDP needs CUDA, so without a GPU `trainer=fsdp` is checked through the strategy the trainer builder makes
    for each task: its wrap policy and activation checkpointing policy name the network's blocks.

    Tried for real on CPU (Lightning 2.6, torch 2.14): Lightning's Trainer refuses FSDPStrategy on any accelerator
    but CUDA -- ValueError("The strategy `fsdp` requires a GPU accelerator, but received `accelerator='cpu'`...")
    -- and past that check torch's FullyShardedDataParallel refuses too -- RuntimeError("FSDP needs a non-CPU
    accelerator device, but no accelerator device is detected."). DDP on CPU (trainer=ddp_cpu) is tested above.
    """
    import lightning as L
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab.strategies import fsdp_strategy

    cfg = compose_cfg(["trainer=fsdp"], tmp_path)
    assert (cfg.trainer.accelerator, cfg.trainer.precision) == ("gpu", "bf16-mixed")
    blocks = _blocks()
    for name, task in _tasks().items():
        for checkpointing in (False, True):
            strategy = fsdp_strategy(cfg.trainer.strategy, task, activation_checkpointing=checkpointing)
            assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "sharded"
            assert strategy.kwargs["auto_wrap_policy"]._module_classes == {blocks[name]}, name
            policy = strategy._activation_checkpointing_kwargs.get("auto_wrap_policy")
            assert (policy._module_classes if policy else None) == ({blocks[name]} if checkpointing else None), name
    with pytest.raises(ValueError, match="requires a GPU accelerator"):  # the reason it is not run on CPU here
        L.Trainer(accelerator="cpu", devices=1, strategy=FSDPStrategy(), logger=False)


def _trainer_of(cfg, task) -> dict:
    """What train.py gives the Trainer for this config and task: its plan, the strategy made for the task."""
    from attnlab.cli import builders
    from attnlab.strategies import for_model

    plan = make_plan(cfg)
    return builders.build_trainer(cfg, plan, [], [], for_model(task, plan.trainer.strategy,
                                                                plan.model.activation_checkpointing))


def test_the_trainer_builder_hands_the_networks_blocks_to_fsdp(tmp_path, monkeypatch, caplog):
    """build_trainer builds the FSDP strategy once the task exists, for attnlab's `trainer=fsdp`, Lightning's own
    FSDPStrategy config and the name `fsdp` alike; a network without block classes is one unit, said in one line."""
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab import devices
    from attnlab.cli import builders
    from attnlab.nn.layers import Block
    from attnlab.tasks.segmentation import Segmenter

    monkeypatch.setattr(devices, "check_devices", lambda *a: None)  # no GPU here: see the test above
    monkeypatch.setattr(builders, "instantiate", lambda cfg, **kwargs: kwargs)  # what the Trainer would be given
    gpt = _tasks()["gpt"]
    for strategy in ("trainer=fsdp", "trainer.strategy=fsdp",
                     "+trainer.strategy={_target_: lightning.pytorch.strategies.FSDPStrategy}"):
        cfg = compose_cfg(["trainer=fsdp", strategy, "model.activation_checkpointing=true"], tmp_path)
        given = _trainer_of(cfg, gpt)["strategy"]
        assert isinstance(given, FSDPStrategy) and given.kwargs["auto_wrap_policy"]._module_classes == {Block}
        assert given._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}, strategy
    unet = Segmenter(net="unet", num_classes=2, in_chans=1, depth=2, base_channels=4)
    with caplog.at_level("INFO", logger="attnlab"):
        fsdp = compose_cfg(["trainer=fsdp"], tmp_path)
        given = _trainer_of(fsdp, unet)["strategy"]
    assert "auto_wrap_policy" not in given.kwargs
    assert "FSDP: UNet declares no block classes (attnlab.protocols.BlockNetwork): the network is one FSDP unit" \
        in caplog.text
    ddp = compose_cfg(["trainer=ddp_cpu"], tmp_path)
    assert "strategy" not in _trainer_of(ddp, gpt)
    cfg = compose_cfg(["trainer=fsdp", "callbacks=ema"], tmp_path)  # an average of FSDP's shards: refused
    with pytest.raises(UserError, match=r"callbacks=ema .* trainer=ddp"):
        _trainer_of(cfg, gpt)


def _loss(name: str, task) -> torch.Tensor:
    """A real forward of the task's network on fixed inputs, to a scalar."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 17, (2, 8), generator=g)
    if name in ("gpt", "bert"):
        return torch.nn.functional.cross_entropy(task.net(tokens).flatten(0, 1), tokens.flatten())
    if name == "transformer_seq2seq":
        return task.net(tokens, tokens.flip(1)).float().square().mean()
    if name == "mae":
        return task.net(torch.randn(2, 1, 16, 16, generator=g), noise=torch.rand(2, 16, generator=g))[0]
    side = 8 if name == "vit" else 32
    return task.net(torch.randn(2, 1, side, side, generator=g)).square().mean()


@pytest.mark.parametrize("name", ["gpt", "bert", "transformer_seq2seq", "mae", "vit", "swin"])
def test_activation_checkpointing_keeps_the_loss_and_the_gradients(name):
    """model.activation_checkpointing=true under DDP or one device: each declared block recomputes its activations
    in the backward pass (dropout and stochastic depth drawing the same numbers again); the loss, the gradients
    and the state dict's names stay as they were."""
    import copy

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from attnlab.strategies import checkpoint_activations

    task = _tasks()[name].train()
    plain, wrapped = task, copy.deepcopy(task)
    blocks = sum(isinstance(m, _blocks()[name]) for m in task.modules())
    assert checkpoint_activations(wrapped) == blocks > 0
    wrappers = [m for m in wrapped.modules() if isinstance(m, CheckpointWrapper)]
    assert len(wrappers) == blocks and all(isinstance(w._checkpoint_wrapped_module, _blocks()[name]) for w in wrappers)
    assert checkpoint_activations(wrapped) == 0  # wrapped once
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    losses = []
    for model in (plain, wrapped):
        torch.manual_seed(1)
        loss = _loss(name, model)
        loss.backward()
        losses.append(loss.detach())
    assert torch.equal(losses[0], losses[1])
    for (n, a), b in zip(plain.named_parameters(), wrapped.parameters()):
        assert (a.grad is None) == (b.grad is None) and (a.grad is None or torch.allclose(a.grad, b.grad, atol=1e-7)), n


@pytest.mark.slow
def test_activation_checkpointing_is_one_setting_of_every_task(tmp_path):
    """model.activation_checkpointing is a platform key: typed for every model config, applied by the builder."""
    from attnlab.cli.checks import check_config
    from attnlab.config import CONF_DIR, prepare

    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        cfg = compose_cfg([f"model={path.stem}", "model.activation_checkpointing=true"], tmp_path)
        prepare(cfg)
        try:
            check_config(cfg)
        except Exception as e:  # a model config that needs other data: only this key matters here
            assert "activation_checkpointing" not in str(e), (path.stem, e)
    cfg = compose_cfg(["model.activation_checkpointing=sometimes"], tmp_path)
    prepare(cfg)
    with pytest.raises(Exception, match=r"model.activation_checkpointing='sometimes' is refused"):
        check_config(cfg)


def test_flop_count_leaves_an_fsdp_model_checkpointable(monkeypatch):
    """FSDP runs on CPU in torch 2.14 when given device_id=cpu (gloo, world size 1, so NO_SHARD)."""
    from timm.models.vision_transformer import Block
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from attnlab.callbacks.throughput import Throughput
    from attnlab.tasks.classification import ImageClassifier

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        task = ImageClassifier(num_classes=10, img_size=8, in_chans=1)
        cb = Throughput()
        cb.setup(None, task, "fit")  # Lightning calls callbacks' setup before the strategy wraps the model
        assert cb._flops and cb._flops > 0
        bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
        model = FSDP(task, auto_wrap_policy=ModuleWrapPolicy({Block}), mixed_precision=bf16,
                     device_id=torch.device("cpu"), use_orig_params=True)  # as Lightning's FSDPStrategy
        x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
        with torch.no_grad():
            model(x)
        with pytest.raises(RuntimeError):  # counting through FSDP units is refused, not attempted
            task.flops_per_sample()
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        for kind in (StateDictType.FULL_STATE_DICT, StateDictType.SHARDED_STATE_DICT):
            with FSDP.state_dict_type(model, kind):
                assert "net.blocks.0.norm1.weight" in model.state_dict()
    finally:
        dist.destroy_process_group()
