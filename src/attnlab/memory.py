"""The memory a training step needs, estimated before the run starts; runs too large for the machine are refused.

The estimate adds, per process:
- on CPU, what the process holds already (`process`: the interpreter and libraries, the data held in memory and the
  weights, read from /proc/self/statm); on a GPU, the weights;
- the gradients of the trainable parameters;
- the optimizer's state: the bytes per parameter byte of the configured optimizer, measured on a small tensor after
  one step (AdamW keeps two tensors per parameter, SGD with momentum one);
- the activations: one training step of the task run on fake tensors (`torch._subclasses.FakeTensorMode`: shapes
  and dtypes, no data), on a real batch from the training loader, with every tensor the step allocates counted while
  it lives; the peak of forward and backward together, so attention's B x H x T^2 scores count where
  `scaled_dot_product_attention` cannot use a fused kernel and not where it can. Kernels also allocate what the
  trace cannot see (oneDNN's reordered copies of convolution inputs, workspaces) and the allocator keeps freed
  blocks: the traced peak is counted 1.25 times (the measured peaks were 1.1-1.5 times the trace on CPU).
It is compared with 90% of the memory available (MemAvailable plus what this process holds, divided among the
local processes of a DDP run) on CPU, and with 90% of the free device memory on a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from attnlab.errors import UserError

log = logging.getLogger("attnlab")

GiB = 1024**3


@dataclass
class MemoryEstimate:
    """Bytes per process: `terms` add up to `total`; `available` is what the process may use."""

    device: str
    terms: dict[str, int] = field(default_factory=dict)
    available: int | None = None
    processes: int = 1
    batch_dims: set[int] = field(default_factory=set)  # the sizes of the sample batch's dimensions

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    @property
    def largest(self) -> str:
        return max(self.terms, key=self.terms.get)

    def describe(self) -> str:
        parts = ", ".join(f"{name} {self.terms[name] / GiB:.2f}" for name in self.terms)
        return f"{self.total / GiB:.2f} GiB per process on {self.device} ({parts})"


# ---- what the machine has
def _peak_rss() -> int:
    """This process's own peak resident memory in bytes: VmHWM on Linux (ru_maxrss there also counts the process it
    was started from, up to its exec: a train.py started by a notebook would report the notebook's size), else
    ru_maxrss (bytes on macOS)."""
    import resource

    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if os.uname().sysname == "Darwin" else rss * 1024


def process_rss() -> int:
    """Resident memory of this process now (bytes); without /proc (macOS) the peak so far stands in for it."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return _peak_rss()


def peak_memory(device: torch.device) -> tuple[str, int]:
    """("GPU", max_memory_allocated) on a GPU; ("CPU", this process's own peak RSS) otherwise, in bytes."""
    if device.type == "cuda":
        return "GPU", torch.cuda.max_memory_allocated(device)
    return "CPU", _peak_rss()


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo (bytes); psutil where there is no /proc; None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


# ---- the parts of the estimate
def optimizer_state_ratio(optimizer_factory) -> float:
    """Bytes of optimizer state per byte of parameter, after one step on a small tensor."""
    p = torch.nn.Parameter(torch.zeros(64, 64))
    try:
        opt = optimizer_factory([p])
        p.grad = torch.full_like(p, 1e-3)
        opt.step()
    except Exception:  # an optimizer that wants more than a plain list of tensors: count AdamW's two
        return 2.0
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if isinstance(t, torch.Tensor) and t.dim() > 0)
    return state / (p.numel() * p.element_size())


class _LiveBytes:
    """A dispatch mode that counts the bytes of every tensor storage an op creates while it is referenced."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker.add(out)
                return out

        self.mode, self.live, self.peak, self._seen = Mode(), 0, 0, set()

    def add(self, out) -> None:
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
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

    buffers = {name: b.clone() for name, b in task.named_buffers()}
    saved = {}
    for m in task.modules():
        if isinstance(m, Metric):
            saved[m] = {name: getattr(m, name) for name in m._defaults} | {"_update_count": m._update_count}
    patched = {name: getattr(task, name) for name in ("log", "log_dict", "log_train_loss") if hasattr(task, name)}
    for name in patched:
        setattr(task, name, lambda *a, **k: None)
    py_state = random.getstate()
    np_state = _numpy_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        for name in patched:
            delattr(task, name)  # the class's method again
        for m, state in saved.items():
            for name, value in state.items():
                setattr(m, name, value)
        with torch.no_grad():
            for name, b in task.named_buffers():
                b.copy_(buffers[name])
        random.setstate(py_state)
        if np_state is not None:
            import numpy as np

            np.random.set_state(np_state)


def _numpy_state():
    try:
        import numpy as np

        return np.random.get_state()
    except ImportError:
        return None


def activation_bytes(task, batch, autocast_dtype: torch.dtype | None = None) -> int | None:
    """Peak bytes of the tensors one training step (forward, loss and backward) allocates: on fake tensors, or,
    where the step has ops whose output shape depends on the data (packed sequences, boolean indexing), on a real
    slice of two samples scaled to the batch. None when the step cannot run outside the trainer."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    try:
        with _quiet_step(task), FakeTensorMode(allow_non_fake_inputs=True) as fake:
            fake_batch = tree_map(lambda t: fake.from_tensor(t) if isinstance(t, torch.Tensor) else t, batch)
            return _traced_step(task, fake_batch, autocast_dtype)
    except UserError:
        raise
    except Exception as e:  # a data-dependent shape, or an op fake tensors do not implement
        log.debug("memory estimate: fake step failed (%s); measuring a real step on two samples", e)
    size = _batch_len(batch)
    part = 2 if size and size > 2 else size
    sliced = tree_map(lambda t: t[:part] if isinstance(t, torch.Tensor) and t.dim() and len(t) == size else t, batch)
    try:
        with _quiet_step(task):
            peak = _traced_step(task, sliced, autocast_dtype)
    except UserError:
        raise
    except Exception as e:
        log.debug("memory estimate: the training step does not run outside the trainer (%s)", e)
        return None
    return peak * size // max(1, part) if size else peak


def _batch_len(batch) -> int | None:
    sizes = [len(t) for t in tree_leaves(batch) if isinstance(t, torch.Tensor) and t.dim()]
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


def sample_batch(dm):
    """The first batch of the training loader, collated in this process (no workers), without moving the loader's
    random state: the run draws the same batches as without the estimate. A sampler of batches of varying length
    (length bucketing: it has `lengths`) gives its largest batch instead, padded length x size. The batch is as the
    step receives it: after the data module's `on_after_batch_transfer` (images: uint8 -> normalized float)."""
    with torch.random.fork_rng(devices=[]):
        loader = dm.train_dataloader()
        sampler = loader.batch_sampler
        if sampler is None:
            return None  # an iterable dataset that batches itself
        lengths = getattr(sampler, "lengths", None)
        if lengths is not None:
            indices = max(iter(sampler), key=lambda b: len(b) * int(max(lengths[i] for i in b)))
        else:
            indices = next(iter(sampler))
        batch = loader.collate_fn([loader.dataset[i] for i in indices])
        try:
            return dm.on_after_batch_transfer(batch, 0)
        except Exception as e:  # a user's hook that needs the trainer: the batch as the loader gives it
            log.debug("memory estimate: on_after_batch_transfer without a trainer failed (%s)", e)
            return batch


# ---- the estimate and the refusal
_UNSEEN = 1.25  # kernels' own buffers and the allocator's slack, see the module's docstring
_PRECISION_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def estimate(task, dm, trainer_cfg: dict, optimizer_factory=None, processes: int = 1,
             on_gpu: bool = False) -> MemoryEstimate | None:
    batch = sample_batch(dm)
    if batch is None:
        return None
    precision = str(trainer_cfg.get("precision") or "32-true")
    half = precision in ("bf16-true", "16-true")
    trainable = sum(p.numel() * p.element_size() for p in task.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in task.parameters())
    if half:
        trainable, weights = trainable // 2, weights // 2
    sharded = "fsdp" in str(trainer_cfg.get("strategy") or "").lower()
    shard = processes if sharded else 1
    ratio = optimizer_state_ratio(optimizer_factory) if optimizer_factory is not None else 2.0
    dtype = _PRECISION_AUTOCAST.get(precision) or (torch.bfloat16 if half else None)
    est = MemoryEstimate(device="GPU" if on_gpu else "CPU", processes=processes)
    if on_gpu:
        est.terms["weights"] = weights // shard
    else:
        est.terms["process"] = process_rss()  # libraries, data in memory, the weights
    est.terms["gradients"] = trainable // shard
    est.terms["optimizer state"] = int(ratio * trainable) // shard
    activations = activation_bytes(task, batch, dtype)
    if activations is None:
        return None
    est.terms["activations"] = int(_UNSEEN * activations)
    est.batch_dims = {int(d) for t in tree_leaves(batch) if isinstance(t, torch.Tensor) for d in t.shape}
    est.available = _available(on_gpu, processes)
    return est


def _available(on_gpu: bool, processes: int) -> int | None:
    if on_gpu:
        try:
            free, _ = torch.cuda.mem_get_info()
        except RuntimeError:  # a driver that does not answer: no limit to compare with
            return None
        return int(0.9 * free)
    avail = mem_available()
    if avail is None:
        return None
    return int(0.9 * (avail + process_rss()) / max(1, processes))


_ADVICE = {
    "activations": "lower {sizes}; trainer.precision=bf16-mixed halves them on hardware with bf16",
    "optimizer state": "use a smaller model or an optimizer with less state (optimizer=sgd); on GPUs, "
                       "trainer=fsdp shards it across devices",
    "gradients": "use a smaller model, or on GPUs trainer=fsdp, which shards the gradients across devices",
    "weights": "use a smaller model, or trainer=fsdp, which shards the weights across devices",
    "process": "the data held in memory and the libraries take this much: use a smaller dataset or a streaming one",
}
_SIZE_KEYS = ("batch_size", "block_size", "max_length", "max_len", "max_tokens", "image_size", "crop_size")


def check_fits(est: MemoryEstimate, data_cfg: dict, force: bool = False) -> None:
    """Refuse a run whose estimate exceeds what the machine has, naming the largest term and the setting to change."""
    if est.available is None or est.total <= est.available:
        return
    # the data settings that are dimensions of the batch (data.block_size of a GPT, not an unused max_length)
    sizes = " or ".join(f"data.{k} (now {data_cfg[k]})" for k in _SIZE_KEYS
                        if isinstance(data_cfg.get(k), int) and (k == "max_tokens" or data_cfg[k] in est.batch_dims))
    advice = _ADVICE[est.largest].format(sizes=sizes or "data.batch_size")
    where = (f"90% of the free memory of the GPU ({est.available / GiB:.2f} GiB)" if est.device == "GPU" else
             f"90% of this machine's available memory{' shared by %d processes' % est.processes if est.processes > 1 else ''}"
             f" ({est.available / GiB:.2f} GiB per process)")
    message = (f"this run needs about {est.total / GiB:.2f} GiB of memory per process, more than {where}. The "
               f"estimate: {est.describe()}; the largest part is {est.largest} ({est.terms[est.largest] / GiB:.2f} "
               f"GiB). To fit: {advice}. extras.force=true starts the run anyway.")
    if force:
        log.warning("%s (starting anyway: extras.force=true)", message.replace(" extras.force=true starts the run "
                                                                               "anyway.", ""))
        return
    raise UserError(message)


def check_run_memory(cfg, task, dm, refuse: bool = True) -> MemoryEstimate | None:
    """Estimate the run's memory and refuse it when it does not fit (extras.force=true: warn and go on;
    refuse=false: only the estimate, for preflight=true to report)."""
    from omegaconf import OmegaConf

    from attnlab.cli.builders import check_devices, device_count
    from attnlab.config import PLATFORM_KEYS

    if os.environ.get("LOCAL_RANK", "0") != "0":
        return None  # the launching process checked for all of them
    check_devices(cfg.trainer)  # devices the machine has, before asking them how much memory is free
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    accelerator = str(trainer_cfg.get("accelerator") or "auto")
    if accelerator in ("gpu", "cuda", "mps", "tpu") and not torch.cuda.is_available():
        return None  # refused by the device checks that come next, or hardware this estimate does not cover
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    factory = None
    if cfg.get("optimizer") and cfg.optimizer.get("_target_"):
        from hydra.utils import instantiate

        node = OmegaConf.to_container(cfg.optimizer, resolve=True)
        for key in PLATFORM_KEYS.get("optimizer", {}):
            node.pop(key, None)
        node["lr"] = node.get("lr") or 1e-3
        factory = instantiate(node | {"_partial_": True})
    est = estimate(task, dm, trainer_cfg, factory, processes=device_count(cfg.trainer), on_gpu=on_gpu)
    if est is None:
        return None
    log.info("memory: about %s; available %s", est.describe(),
             "unknown" if est.available is None else f"{est.available / GiB:.2f} GiB per process")
    if refuse:
        data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
        check_fits(est, data_cfg, force=bool((cfg.get("extras") or {}).get("force")))
    return est
