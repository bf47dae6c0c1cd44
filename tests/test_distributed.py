"""DDP on 2 CPU processes (gloo) optimizes exactly like one process with the same global batch."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as dist

from conftest import compose_cfg, run_cli

COMMON = ["trainer.max_epochs=2", "data.augment=null", "test=false", "extras.print_config=false",
          "callbacks.progress_bar=null", "trainer.limit_train_batches=12"]


def test_ddp_cpu_matches_one_process_with_the_same_global_batch(tmp_path, log_env):
    single = run_cli("train.py", *COMMON, "data.batch_size=32", "trainer.limit_train_batches=12",
                     f"hydra.run.dir={tmp_path}/single", env=log_env)
    assert single.returncode == 0, single.stdout[-3000:]
    ddp = run_cli("train.py", *COMMON, "trainer=ddp_cpu", "data.batch_size=16", f"hydra.run.dir={tmp_path}/ddp",
                  env=log_env)
    assert ddp.returncode == 0, ddp.stdout[-3000:]
    one = json.loads((tmp_path / "single" / "metrics.json").read_text())
    two = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    # each global step sees the same 32 samples, split 16 + 16 across the ranks; gradients are averaged
    assert two["val/loss"] == pytest.approx(one["val/loss"], abs=2e-3)
    assert two["val/acc"] == pytest.approx(one["val/acc"], abs=1 / 180 + 1e-6)


def test_fsdp_composes_and_wraps_each_transformer_block(tmp_path):
    """FSDP needs CUDA, so without a GPU `trainer=fsdp` is checked by composition and by building its strategy.

    Tried for real on CPU (Lightning 2.6, torch 2.14): Lightning's Trainer refuses FSDPStrategy on any accelerator
    but CUDA -- ValueError("The strategy `fsdp` requires a GPU accelerator, but received `accelerator='cpu'`...")
    -- and past that check torch's FullyShardedDataParallel refuses too -- RuntimeError("FSDP needs a non-CPU
    accelerator device, but no accelerator device is detected."). DDP on CPU (trainer=ddp_cpu) is tested above.
    """
    import lightning as L
    from lightning.pytorch.strategies import FSDPStrategy
    from timm.models.vision_transformer import Block

    from attnlab.cli.builders import instantiate

    cfg = compose_cfg(["trainer=fsdp"], tmp_path)
    assert (cfg.trainer.accelerator, cfg.trainer.precision) == ("gpu", "bf16-mixed")
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "sharded"
    wrapped = strategy.kwargs["auto_wrap_policy"]._module_classes
    assert Block in wrapped  # each timm ViT block is its own FSDP unit
    with pytest.raises(ValueError, match="requires a GPU accelerator"):  # the reason it is not run on CPU here
        L.Trainer(accelerator="cpu", devices=1, strategy=FSDPStrategy(), logger=False)


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
