"""What makes a training step fast on a GPU, checked on CPU: the step's network and loss trace as one graph for
torch.compile, and nothing in a step that is not a logging step waits for the device (no `.item()`, `bool()`,
`.tolist()`, `.cpu()`, no tensor built from Python numbers on the device)."""

from __future__ import annotations

import traceback

import lightning as L
import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnlab.cli.training import train
from conftest import FAST, compose_cfg


def _batches():
    """(task, training_loss arguments) for a small network of every task."""
    from attnlab.tasks.classification import ImageClassifier
    from attnlab.tasks.language_model import CausalLM, MaskedLM
    from attnlab.tasks.mae import MAEPretrainer
    from attnlab.tasks.segmentation import Segmenter
    from attnlab.tasks.text_classification import TextClassifier
    from attnlab.tasks.translation import Translator

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 64, (2, 16), generator=g)
    lm = dict(n_layer=1, n_head=2, n_embd=32)
    img = torch.randn(2, 3, 32, 32, generator=g)
    yield "gpt", CausalLM(vocab_size=64, block_size=16, **lm), (ids, ids.roll(-1, 1))
    positions = torch.arange(0, 32, 4)                              # masked_positions: ::4 of each row, flattened
    yield "bert", MaskedLM(vocab_size=64, max_length=16, **lm), \
        (ids, torch.ones_like(ids), positions, ids.flatten()[positions])
    yield "vit", ImageClassifier(num_classes=10, img_size=32, backbone="vit_tiny_patch16_224", label_smoothing=0.1), \
        (img, torch.tensor([1, 2]))
    yield "vit+mixup", ImageClassifier(num_classes=10, img_size=32, backbone="vit_tiny_patch16_224"), \
        (img, torch.softmax(torch.randn(2, 10, generator=g), -1))
    yield "bert classifier", TextClassifier(vocab_size=64, max_length=16, **lm), \
        (ids, torch.ones_like(ids), None, torch.tensor([0, 1]))
    yield "transformer_seq2seq", Translator(net="transformer_seq2seq", src_vocab_size=64, tgt_vocab_size=64, **lm,
                                            ffn_hidden=64), (ids, ids)
    yield "unet", Segmenter(net="unet", num_classes=3, img_size=32, base_channels=8), \
        (img, torch.randint(0, 3, (2, 32, 32), generator=g))
    yield "mae", MAEPretrainer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, decoder_dim=16,
                                decoder_depth=1, decoder_heads=2), (img,)


# rnn_seq2seq is not among them: torch.compile runs nn.LSTM/GRU/RNN eagerly (dynamo skips them), and packed
# sequences take their lengths on the host
@pytest.mark.parametrize("name", ["gpt", "bert", "vit", "vit+mixup", "bert classifier", "transformer_seq2seq",
                                  "unet", "mae"])
def test_the_training_loss_of_every_task_traces_as_one_graph(name):
    """model.compile=true compiles `training_loss`: the network with the loss, as nanoGPT compiles its model with
    its loss. A graph break would split it and run the loss eagerly (9.1 vs 5.8 ms for GPT-2's output layer and
    loss on an H200)."""
    task, args = next((t, a) for n, t, a in _batches() if n == name)
    task.train()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):  # as BaseTask.configure_model
        explained = torch._dynamo.explain(task.training_loss)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    eager = task.training_loss(*args)
    eager = eager[0] if isinstance(eager, tuple) else eager
    assert eager.ndim == 0 and torch.isfinite(eager)


# ---- host-device synchronisations, counted on CPU where they cost nothing but are the same calls as on a GPU
SYNCING = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
           torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.nonzero,
           torch.nonzero, torch.tensor, torch.as_tensor, torch.Tensor.new_tensor, torch.Tensor.to}


class _Count(TorchFunctionMode):
    def __init__(self, calls: list):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING and self._syncs(func, args, kwargs):
            stack = traceback.extract_stack()[:-1]
            # torch.optim keeps its step counters on the host by design (capturable=False): reading them costs no wait
            if not any("/torch/optim/" in f.filename for f in stack[-6:]):
                self.calls.append((func.__name__, [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}"
                                                   for f in stack[-4:]]))
        return func(*args, **kwargs)

    @staticmethod
    def _syncs(func, args, kwargs) -> bool:
        if func is torch.Tensor.to:  # a copy to the host waits; a dtype cast or a copy to the device does not
            target = kwargs.get("device") or next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
            return target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu"
        if func in (torch.tensor, torch.as_tensor):  # built from Python numbers: a host-to-device copy on a GPU
            return not isinstance(args[0] if args else None, torch.Tensor) and kwargs.get("device") is not None
        return True


class SyncCounter(L.Callback):
    """Counts the synchronising calls of each training step: from the first callback's `on_train_batch_start` (this
    one, first in the list) to the last callback's `on_train_batch_end` (its `stop`, last in the list)."""

    def __init__(self):
        self.per_step: dict[int, list] = {}
        self._mode: _Count | None = None
        counter = self

        class Stop(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                counter._mode.__exit__(None, None, None)

        self.stop = Stop()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._mode = _Count(self.per_step.setdefault(trainer.global_step, []))
        self._mode.__enter__()


@pytest.mark.parametrize("overrides", [
    ["model=gpt_char", "data=synthetic_text", "data.vocab_size=64", "data.block_size=16", "model.n_layer=1",
     "model.n_head=2", "model.n_embd=32", "model.num_samples=0"],
    ["model=vit_tiny", "data=synthetic_images", "data.image_size=32", "data.num_classes=10",
     "+model.mixup={mixup_alpha:0.8,cutmix_alpha:1.0}", "model.label_smoothing=0.1"],
], ids=["gpt", "vit+mixup"])
def test_a_training_step_waits_for_the_device_only_when_it_logs(tmp_path, monkeypatch, overrides):
    """Every default callback on (NaN guard, throughput, learning-rate monitor, checkpoints): a step that is not a
    logging step makes no synchronising call. The NaN guard, the running loss mean and the training accuracy
    accumulate on the device and are read on logging steps."""
    counter = SyncCounter()
    from attnlab.cli import builders

    build = builders.build_callbacks

    def with_counter(*args, **kwargs):  # the run's own callbacks between the counter's start and stop
        return [counter, *build(*args, **kwargs), counter.stop]

    monkeypatch.setattr(builders, "build_callbacks", with_counter)
    cfg = compose_cfg([*overrides, "data.batch_size=4", "data.num_workers=0", "data.train_samples=64",
                       "data.val_samples=8", "trainer=cpu", "trainer.max_steps=12", "trainer.max_epochs=-1",
                       "trainer.log_every_n_steps=5", "trainer.num_sanity_val_steps=0", "test=false", "logger=csv",
                       *FAST], tmp_path)
    train(cfg)
    logging = {s for s in counter.per_step if (s + 1) % 5 == 0 or s == 0}
    quiet = {s: calls for s, calls in counter.per_step.items() if s not in logging}
    assert len(quiet) >= 8
    assert all(not calls for calls in quiet.values()), next(c for c in quiet.values() if c)
