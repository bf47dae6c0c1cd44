"""One training step of a task, run outside the trainer to measure it: the peak bytes of the tensors it allocates
(`activation_bytes`, for attnlab.memory) and its FLOPs (`step_flops`). The step runs quietly: no logging, and no
metric, buffer or random-state change that stays."""

from __future__ import annotations

import contextlib
import logging
import random
import weakref

import numpy as np
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch.nn.parameter import is_lazy

from attnlab.compat import storage_key
from attnlab.errors import UserError

log = logging.getLogger("attnlab")


class _LiveBytes:
    """A dispatch mode that counts the bytes of every tensor storage an op creates while it is referenced."""

    def __init__(self):
        from attnlab.compat import dispatch_mode_class

        tracker = self

        class Mode(dispatch_mode_class()):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker.add(out)
                return out

        self.mode, self.live, self.peak, self._seen = Mode(), 0, 0, set()

    def add(self, out) -> None:
        for t in tensors(out):
            storage = t.untyped_storage()
            key = storage_key(storage)
            if key in self._seen:
                continue
            self._seen.add(key)
            n = storage.nbytes()
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, n)

    def _free(self, key, n) -> None:
        self.live -= n
        self._seen.discard(key)


@contextlib.contextmanager
def _quiet_step(task):
    """Run a training step without logging, and without metric updates, buffer updates (batch-norm statistics)
    or random draws that would stay."""
    from torchmetrics import Metric

    from attnlab.compat import metric_state, restore_metric_state

    buffers = {name: b.clone() for name, b in task.named_buffers()}
    saved = {m: metric_state(m) for m in task.modules() if isinstance(m, Metric)}
    py_state = random.getstate()
    np_state = np.random.get_state()
    try:
        with logging_off(task), torch.random.fork_rng(devices=[]):
            yield
    finally:
        for m, state in saved.items():
            restore_metric_state(m, state)
        with torch.no_grad():
            for name, b in task.named_buffers():
                b.copy_(buffers[name])
        random.setstate(py_state)
        np.random.set_state(np_state)


@contextlib.contextmanager
def logging_off(task):
    """A LightningModule's step outside the trainer: its `log`, `log_dict` and attnlab's `log_train_loss` do nothing
    meanwhile (they would ask the trainer for its loop state)."""
    names = [n for n in ("log", "log_dict", "log_train_loss") if callable(getattr(type(task), n, None))]
    for name in names:
        setattr(task, name, lambda *a, **k: None)
    try:
        yield
    finally:
        for name in names:
            delattr(task, name)  # the class's method again


def activation_bytes(task, batch, autocast_dtype: torch.dtype | None = None) -> int | None:
    """Peak bytes of the tensors one training step (forward, loss and backward) allocates: on fake tensors, or,
    where the step has ops whose output shape depends on the data (packed sequences, boolean indexing), on a real
    slice of two samples scaled to the batch. None when the step cannot run outside the trainer."""
    from attnlab.compat import fake_tensor_mode

    size = _batch_len(batch)
    part = 2 if size and size > 2 else size
    sliced = _first(batch, part, size)
    # lazy modules (`nn.LazyLinear`, ...) get their parameters by one real step without gradients, as PyTorch asks
    if any(is_lazy(p) for p in task.parameters()):
        with _quiet_step(task), torch.no_grad():
            task.training_step(sliced, 0)
    try:
        with _quiet_step(task), fake_tensor_mode(allow_non_fake_inputs=True) as fake:
            fake_batch = apply_to_collection(batch, torch.Tensor, fake.from_tensor)
            return _traced_step(task, fake_batch, autocast_dtype)
    except UserError:
        raise
    except Exception as e:  # a data-dependent shape, or an op fake tensors do not implement
        log.debug("memory estimate: fake step failed (%s); measuring a real step on two samples", e)
    try:
        with _quiet_step(task):
            peak = _traced_step(task, sliced, autocast_dtype)
    except UserError:
        raise
    except Exception as e:
        log.debug("memory estimate: the training step does not run outside the trainer (%s)", e)
        return None
    return peak * size // max(1, part) if size else peak


def step_flops(task, batch) -> int | None:
    """FLOPs of the task's training step (forward and loss, as torch's FlopCounterMode counts them) on one sample of
    `batch`: on fake tensors, else on the real sample. None when the step cannot run outside the trainer."""
    from torch.utils.flop_counter import FlopCounterMode

    from attnlab.compat import fake_tensor_mode

    size = _batch_len(batch)
    if not size:
        return None
    one = _first(batch, 1, size)
    for fake in (True, False):
        counter = FlopCounterMode(display=False)
        try:
            with _quiet_step(task), torch.no_grad(), contextlib.ExitStack() as stack:
                if fake:
                    mode = stack.enter_context(fake_tensor_mode(allow_non_fake_inputs=True))
                    sample = apply_to_collection(one, torch.Tensor, mode.from_tensor)
                else:
                    sample = one
                with counter:
                    task.training_step(sample, 0)
            return int(counter.get_total_flops())
        except Exception as e:  # a data-dependent shape on fake tensors: the real sample; else none (a count is
            # best effort: the run itself says what is wrong with its batches)
            log.debug("FLOP count of the training step failed (%s)", e)
    return None


def tensors(tree) -> list[torch.Tensor]:
    """Every tensor of a nested batch or output (lists, tuples, dicts, dataclasses), in order."""
    found: list[torch.Tensor] = []
    apply_to_collection(tree, torch.Tensor, found.append)
    return found


def _first(batch, part: int | None, size: int | None):
    """The batch's first `part` samples: each tensor whose leading dimension is the batch's size, sliced."""
    return apply_to_collection(batch, torch.Tensor, lambda t: t[:part] if t.dim() and len(t) == size else t)


def _batch_len(batch) -> int | None:
    sizes = [len(t) for t in tensors(batch) if t.dim()]
    return max(set(sizes), key=sizes.count) if sizes else None


def _traced_step(task, batch, autocast_dtype) -> int:
    params = [p for p in task.parameters() if p.requires_grad]
    counter = _LiveBytes()
    was_training = task.training
    task.train()
    autocast = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    try:
        with counter.mode, autocast:
            out = task.training_step(batch, 0)
            loss = out.get("loss") if isinstance(out, dict) else out
            if isinstance(loss, torch.Tensor) and loss.requires_grad and params:
                torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        task.train(was_training)
    return counter.peak
