"""The memory a training step needs per process, estimated before the run starts; a run too large for the machine is
refused. The estimate adds the weights (on CPU, all the process holds), gradients, optimizer state, a callback's
average of the weights, and one step's activations as traced (traced_step.py) times 1.25 for what the trace cannot
see; the limit is 90% of the free GPU memory, or on CPU of MemAvailable plus this process's, shared by local processes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
from torch.nn.parameter import is_lazy

from attnlab.errors import UserError
from attnlab.traced_step import activation_bytes, tensors
from attnlab.utils.env import hwm_bytes, package_versions

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
def peak_rss() -> int:
    """This process's own peak resident memory in bytes: VmHWM on Linux (whose ru_maxrss also counts the process it
    started from, up to its exec), else ru_maxrss (bytes on macOS)."""
    import resource

    if found := hwm_bytes():
        return found
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if os.uname().sysname == "Darwin" else rss * 1024


def process_rss() -> int:
    """Current resident memory of this process (bytes); without /proc (macOS) the peak so far stands in for it."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return peak_rss()


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


def sample_batch(dm):
    """The first batch of the training loader, collated in this process (no workers), without moving the loader's
    random state: the run draws the same batches as without the estimate. A sampler of batches of varying length
    (length bucketing: it has `lengths`) gives its largest batch instead, padded length x size. The batch is as the
    step receives it: after the data module's `on_after_batch_transfer` (images: uint8 -> normalized float)."""
    with torch.random.fork_rng(devices=[]):
        loader = dm.train_dataloader()
        sampler, dataset = loader.batch_sampler, loader.dataset
        if isinstance(dataset, torch.utils.data.IterableDataset):  # streamed (shards): the split's first samples
            dataset = getattr(dm, "train_set", None)
            if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset):
                return None  # an iterable dataset that batches itself
            indices = range(min(loader.batch_size or 1, len(dataset)))
        elif sampler is None:
            return None
        elif getattr(sampler, "lengths", None) is not None:
            lengths = sampler.lengths
            indices = max(iter(sampler), key=lambda b: len(b) * int(max(lengths[i] for i in b)))
        else:
            indices = next(iter(sampler))
        batch = loader.collate_fn([dataset[i] for i in indices])
        try:
            return dm.on_after_batch_transfer(batch, 0)
        except Exception as e:  # a user's hook that needs the trainer: the batch as the loader gives it
            log.debug("memory estimate: on_after_batch_transfer without a trainer failed (%s)", e)
            return batch


# ---- the estimate and the refusal
_UNSEEN = 1.25  # kernels' own buffers and the allocator's slack, see the module's docstring
_PRECISION_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def estimate(task, dm, trainer_cfg: dict, optimizer_factory=None, processes: int = 1, on_gpu: bool = False,
             cache_dir: str | None = None, averaged: bool = False, sharded: bool = False) -> MemoryEstimate | None:
    batch = sample_batch(dm)
    if batch is None:
        return None
    precision = str(trainer_cfg.get("precision") or "32-true")
    half = precision in ("bf16-true", "16-true")
    dtype = _PRECISION_AUTOCAST.get(precision) or (torch.bfloat16 if half else None)
    est = MemoryEstimate(device="GPU" if on_gpu else "CPU", processes=processes)
    est.available = _available(on_gpu, processes)
    if not on_gpu:
        est.terms["process"] = process_rss()  # libraries, data in memory, the weights
    activations = cached_activation_bytes(task, batch, dtype, cache_dir)  # lazy modules get their parameters first
    if activations is None:
        return None
    trainable = sum(p.numel() * p.element_size() for p in task.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in task.parameters())
    if half:
        trainable, weights = trainable // 2, weights // 2
    shard = processes if sharded else 1
    ratio = optimizer_state_ratio(optimizer_factory) if optimizer_factory is not None else 2.0
    if on_gpu:
        est.terms["weights"] = weights // shard
    est.terms["gradients"] = trainable // shard
    est.terms["optimizer state"] = int(ratio * trainable) // shard
    if averaged:  # the average is a whole copy of the module (parameters and buffers), never sharded
        est.terms["averaged weights"] = weights + sum(b.numel() * b.element_size() for b in task.buffers())
    est.terms["activations"] = int(_UNSEEN * activations)
    est.batch_dims = {int(d) for t in tensors(batch) for d in t.shape}
    return est


# task settings a traced step does not depend on (no optimizer step is traced): a sweep over them reads one trace
_NOT_IN_THE_STEP = {"optimizer", "scheduler", "monitor", "monitor_mode"}


def cached_activation_bytes(task, batch, dtype: torch.dtype | None, cache_dir: str | None) -> int | None:
    """activation_bytes, read from `<cache_dir>/memory/` when a step of the same network, settings, code, batch
    shapes and library versions has been traced before (and written there after a trace); a task with lazy modules
    is traced every time."""
    if not cache_dir or any(is_lazy(p) for p in task.parameters()):
        return activation_bytes(task, batch, dtype)
    import hashlib
    import inspect
    import json
    from pathlib import Path

    from attnlab.utils.atomic import write_text

    sources = []
    for obj in {type(task), type(getattr(task, "net", task))}:
        try:
            sources.append(hashlib.sha256(Path(inspect.getfile(obj)).read_bytes()).hexdigest())
        except (TypeError, OSError):  # defined in a notebook or a REPL: no file to read
            return activation_bytes(task, batch, dtype)
    key = {"task": f"{type(task).__module__}.{type(task).__qualname__}", "network": repr(task),
           "hparams": repr(sorted((k, v) for k, v in dict(getattr(task, "hparams", {}) or {}).items()
                                  if k not in _NOT_IN_THE_STEP)), "sources": sorted(sources),
           "trainable": [(n, p.shape) for n, p in task.named_parameters() if p.requires_grad],
           "batch": [(tuple(t.shape), t.dtype) for t in tensors(batch)],
           "autocast": dtype,
           "versions": package_versions(("attnlab", "torch", "timm", "lightning", "transformers",
                                         "segmentation-models-pytorch"))}
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:24]
    path = Path(cache_dir) / "memory" / f"{digest}.json"
    try:
        return int(json.loads(path.read_text())["activation_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    peak = activation_bytes(task, batch, dtype)
    if peak is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps({"activation_bytes": peak}))
        except OSError as e:  # a read-only or full cache folder: the next run traces again
            log.debug("memory: estimate not cached (%s)", e)
    return peak


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
    "averaged weights": "keep the average on the CPU (callbacks.ema.device=cpu) or leave it out (callbacks=default)",
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
    shared = " shared by %d processes" % est.processes if est.processes > 1 else ""
    where = (f"90% of the free memory of the GPU ({est.available / GiB:.2f} GiB)" if est.device == "GPU" else
             f"90% of this machine's available memory{shared} ({est.available / GiB:.2f} GiB per process)")
    message = (f"this run needs about {est.total / GiB:.2f} GiB of memory per process, more than {where}. The "
               f"estimate: {est.describe()}; the largest part is {est.largest} ({est.terms[est.largest] / GiB:.2f} "
               f"GiB). To fit: {advice}. extras.force=true starts the run anyway.")
    if force:
        log.warning("%s (starting anyway: extras.force=true)", message.replace(" extras.force=true starts the run "
                                                                               "anyway.", ""))
        return
    raise UserError(message)


def averages_weights(callbacks: dict) -> bool:
    """Whether one of the run's callbacks (their config nodes, by name) keeps an average of the weights (EMA, SWA):
    a second copy of the model."""
    from hydra.utils import get_class
    from lightning.pytorch.callbacks import StochasticWeightAveraging, WeightAveraging

    for node in (callbacks or {}).values():
        target = node.get("_target_") if isinstance(node, dict) else None
        try:
            cls = get_class(target) if target else None
        except Exception:  # not a class path: the callback's own check refuses it
            continue
        if isinstance(cls, type) and issubclass(cls, (WeightAveraging, StochasticWeightAveraging)):
            return True
    return False


def check_run_memory(plan, task, dm, data: dict | None = None, refuse: bool = True) -> MemoryEstimate | None:
    """Estimate the run's memory (its plan: cli/plan.py, with its optimizer's arguments; its data node, resolved)
    and refuse it when it does not fit (extras.force=true: warn and go on; refuse=false: only the estimate, for
    preflight=true to report)."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return None  # the launching process checked for all of them
    t = plan.trainer
    if t.accelerator in ("gpu", "cuda", "mps", "tpu") and not torch.cuda.is_available():
        return None  # refused by the device checks, or hardware this estimate does not cover
    factory = None
    if plan.optimizer:
        from hydra.utils import instantiate

        node = dict(plan.optimizer)
        node["lr"] = node.get("lr") or 1e-3
        factory = instantiate(node | {"_partial_": True})
    try:
        est = estimate(task, dm, {"precision": t.precision}, factory, processes=t.devices, on_gpu=t.on_gpu,
                       cache_dir=plan.cache_dir, averaged=plan.averages_weights, sharded=t.sharded)
    except UserError:
        raise
    except Exception as e:  # the estimate is a look before the run, never what stops it
        log.warning("memory: no estimate for this run (%s: %s); it goes on without one", type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "")
        return None
    if est is None:
        return None
    log.info("memory: about %s; available %s", est.describe(),
             "unknown" if est.available is None else f"{est.available / GiB:.2f} GiB per process")
    if refuse:
        check_fits(est, data or {}, force=plan.force)
    return est
