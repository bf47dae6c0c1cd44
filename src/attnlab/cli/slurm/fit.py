"""The resources of a run's SLURM job, fitted to its partition from the run's own settings.

`fit(settings, cluster)` is pure: the run's settings (trainer.*, data.num_workers, launcher.*) and the cluster as
`sinfo`/`sacctmgr` describe it in, the job's resources out, or a UserError naming the setting to change. Values the
user gave are kept, and refused when the partition cannot give them or they contradict each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnlab.cluster.nodes import Cluster, NodeKind, Partition, format_minutes
from attnlab.errors import UserError

AUTO = "auto"
DEFAULT_LEAD_S, MIN_LEAD_S = 120, 10
UNLIMITED_TIMEOUT_MIN = 1440  # launcher.timeout_min=auto on a partition without a time limit
GPU_ACCELERATORS = ("gpu", "cuda")


@dataclass
class Settings:
    """The run's settings that decide its job's resources; `given` holds the keys set on the command line."""

    accelerator: str = "auto"
    devices: Any = AUTO
    num_nodes: int = 1
    num_workers: int = 0
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus_per_node: Any = AUTO
    tasks_per_node: Any = AUTO
    cpus_per_task: Any = AUTO
    mem_gb: Any = None
    timeout_min: Any = AUTO
    signal_delay_s: Any = AUTO
    max_num_timeout: int = 3
    given: set[str] = field(default_factory=set)


@dataclass
class Fit:
    partition: Partition
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    timeout_min: int
    signal_delay_s: int
    devices: int
    mem_gb: int | None = None  # launcher.mem_gb=auto: from the run's own estimate (estimates.py)
    timeout_from: str = ""  # where the time limit and the memory came from, when the run's estimate was asked for
    mem_from: str = ""

    def overrides(self) -> dict[str, Any]:
        """The fitted values as the run's own keys (null: no GPU is requested)."""
        return {"launcher.partition": self.partition.name, "launcher.tasks_per_node": self.tasks_per_node,
                "launcher.gpus_per_node": self.gpus_per_node or None, "launcher.cpus_per_task": self.cpus_per_task,
                "launcher.timeout_min": self.timeout_min, "launcher.signal_delay_s": self.signal_delay_s,
                "trainer.devices": self.devices} | ({"launcher.mem_gb": self.mem_gb} if self.mem_from else {})

    def describe(self) -> str:
        gpus = f"{self.gpus_per_node} GPU{'s' * (self.gpus_per_node != 1)}" if self.gpus_per_node else "no GPU"
        return (f"SLURM partition {self.partition.name}: {self.nodes} node{'s' * (self.nodes != 1)} x "
                f"{self.tasks_per_node} task{'s' * (self.tasks_per_node != 1)} (trainer.devices={self.devices}), "
                f"{self.cpus_per_task} CPU{'s' * (self.cpus_per_task != 1)} per task, {gpus} per node, time limit "
                f"{self.timeout_min} min{f' ({self.timeout_from})' if self.timeout_from else ''}, USR1 "
                f"{self.signal_delay_s} s before it"
                + (f", memory {f'{self.mem_gb} GB' if self.mem_gb else 'not asked'} ({self.mem_from})"
                   if self.mem_from else ""))


def fit(s: Settings, cluster: Cluster) -> Fit:
    """The job's resources. By default: one task per device; GPUs only when the trainer uses them (`gpu`, or `auto`
    on a partition with GPUs), `trainer.devices` of them (a node's GPUs for `devices=auto`); `data.num_workers + 1`
    CPUs per task, within the node; the partition's time limit, and the warning signal 120 s before it (at most a
    fifth of the limit, at least 10 s)."""
    part = _partition(s, cluster)
    _check_accounting(s, cluster)
    nodes = _int_setting("trainer.num_nodes", s.num_nodes, minimum=1)
    if nodes > part.node_count:
        raise UserError(f"trainer.num_nodes={nodes}: partition {part.name} has {part.node_count} node"
                        f"{'s' * (part.node_count != 1)} ({part.describe()}). Set trainer.num_nodes={part.node_count} "
                        f"or fewer{_others(cluster, part, lambda p: p.node_count >= nodes, 'with enough nodes')}.")
    kind = _node_kind(part, nodes)
    gpus = _gpus(s, part, kind, cluster)
    tasks, devices = _tasks(s, gpus)
    cpus = _cpus(s, part, kind, tasks)
    _check_nodes(s, part, nodes, gpus, tasks * cpus, cluster)
    timeout = _timeout(s, part, cluster)
    return Fit(part, nodes, tasks, gpus, cpus, timeout, _lead(s, timeout), devices)


# ---- the partition, accounts and QOS

def _partition(s: Settings, cluster: Cluster) -> Partition:
    names = ", ".join(p.describe() for p in cluster.partitions.values()) or "none"
    if s.partition is None:
        part = cluster.default_partition
        if part is None:
            raise UserError(f"launcher=slurm needs a partition: this cluster has no default one. Set "
                            f"launcher.partition=<name>; its partitions: {names}.")
        return part
    if "," in str(s.partition):
        raise UserError(f"launcher.partition={s.partition}: attnlab fits a job to one partition; name one of "
                        f"{names}.")
    if str(s.partition) not in cluster.partitions:
        raise UserError(f"launcher.partition={s.partition}: this cluster has no partition '{s.partition}'. Set "
                        f"launcher.partition to one of its partitions: {names}.")
    return cluster.partitions[str(s.partition)]


def _check_accounting(s: Settings, cluster: Cluster) -> None:
    for key, value, known in (("account", s.account, cluster.accounts), ("qos", s.qos, cluster.qos)):
        if value is None or known is None or str(value) in known:
            continue
        raise UserError(f"launcher.{key}={value}: SLURM's accounting has no {'account' if key == 'account' else 'QOS'} "
                        f"'{value}' for user {cluster.user or 'this user'}; theirs: {', '.join(sorted(known))}. Set "
                        f"launcher.{key} to one of them, or launcher.{key}=null for the user's default.")


def _node_kind(part: Partition, nodes: int) -> NodeKind:
    """The kind of node the job is fitted to: the largest of those the partition has enough of."""
    enough = [k for k in part.nodes if k.count >= nodes] or part.nodes
    return max(enough, key=lambda k: (k.gpus, k.cpus, k.mem_mb))


# ---- GPUs, tasks, CPUs

def _gpus(s: Settings, part: Partition, kind: NodeKind, cluster: Cluster) -> int:
    accel = str(s.accelerator).lower()
    given = None if s.gpus_per_node == AUTO else _int_setting("launcher.gpus_per_node", s.gpus_per_node or 0)
    with_gpus = _others(cluster, part, lambda p: p.max_gpus > 0, "with GPUs")
    if accel in GPU_ACCELERATORS and not kind.gpus:
        raise UserError(f"trainer.accelerator={s.accelerator}: partition {part.name} has no GPUs ({part.describe()}). "
                        f"Train on its CPUs with trainer.accelerator=cpu (trainer=cpu, or trainer=ddp_cpu"
                        f"){with_gpus}.")
    if given and not kind.gpus:
        raise UserError(f"launcher.gpus_per_node={given}: partition {part.name} has no GPUs ({part.describe()}), and "
                        f"sbatch refuses a GPU request there. Set launcher.gpus_per_node=auto (GPUs only when the "
                        f"trainer uses them){with_gpus}.")
    uses_gpus = accel in GPU_ACCELERATORS or (accel == AUTO and kind.gpus > 0)
    if not uses_gpus:
        if given:
            raise UserError(f"launcher.gpus_per_node={given} with trainer.accelerator={s.accelerator}: the run trains "
                            "on CPUs and would leave the GPUs idle. Set trainer.accelerator=gpu to train on them, or "
                            "launcher.gpus_per_node=auto.")
        return 0
    devices = s.devices if _is_count(s.devices) else None
    if given is not None and devices is not None and "trainer.devices" in s.given and int(devices) != given:
        raise UserError(f"trainer.devices={devices} but launcher.gpus_per_node={given}: one task trains on each GPU, "
                        f"so they must agree. Set one of them (the other follows), e.g. trainer.devices={given}.")
    gpus = given if given is not None else int(devices) if devices is not None else kind.gpus
    if gpus > kind.gpus or gpus < 1:
        key = "launcher.gpus_per_node" if given is not None else "trainer.devices"
        raise UserError(f"{key}={gpus}: the nodes of partition {part.name} have {kind.gpus} GPU"
                        f"{'s' * (kind.gpus != 1)} each ({part.describe()}). Set {key}={kind.gpus} or fewer; "
                        f"more GPUs come from more nodes (trainer.num_nodes).")
    return gpus


def _tasks(s: Settings, gpus: int) -> tuple[int, int]:
    """(tasks per node, trainer.devices): one task per device."""
    given = None if s.tasks_per_node == AUTO else _int_setting("launcher.tasks_per_node", s.tasks_per_node, minimum=1)
    devices = int(s.devices) if _is_count(s.devices) else None
    devices_given = devices is not None and "trainer.devices" in s.given
    if gpus:
        if given is not None and given != gpus:
            raise UserError(f"launcher.tasks_per_node={given} with {gpus} GPU(s) per node: Lightning runs one task per "
                            f"GPU. Set launcher.tasks_per_node=auto (or {gpus}), or launcher.gpus_per_node={given}.")
        return gpus, gpus
    if given is not None:
        if devices_given and devices != given:
            raise UserError(f"trainer.devices={devices} but launcher.tasks_per_node={given}: Lightning runs one task "
                            f"per device and refuses a different count. Set one of them (the other follows).")
        return given, given
    if devices is not None and devices < 1:
        raise UserError(f"trainer.devices={s.devices}: a job runs at least one task per node; set trainer.devices=1 "
                        "or more.")
    tasks = devices or 1
    return tasks, tasks


def _cpus(s: Settings, part: Partition, kind: NodeKind, tasks: int) -> int:
    per_task = kind.cpus // tasks
    if per_task < 1:
        key = "launcher.tasks_per_node" if "launcher.tasks_per_node" in s.given else "trainer.devices"
        raise UserError(f"{key}={tasks}: {tasks} tasks per node, but the nodes of partition {part.name} have "
                        f"{kind.cpus} CPUs ({part.describe()}). Set {key}={kind.cpus} or fewer.")
    if s.cpus_per_task == AUTO or s.cpus_per_task is None:
        workers = max(0, _int_setting("data.num_workers", s.num_workers or 0))
        return max(1, min(workers + 1, per_task))
    cpus = _int_setting("launcher.cpus_per_task", s.cpus_per_task, minimum=1)
    if cpus > per_task:
        raise UserError(f"launcher.cpus_per_task={cpus}: the nodes of partition {part.name} have {kind.cpus} CPUs "
                        f"({part.describe()}), {per_task} for each of the {tasks} task{'s' * (tasks != 1)} per node. "
                        f"Set launcher.cpus_per_task={per_task} or fewer, or launcher.cpus_per_task=auto "
                        "(data.num_workers + 1, within the node).")
    return cpus


def _check_nodes(s: Settings, part: Partition, nodes: int, gpus: int, cpus: int, cluster: Cluster) -> None:
    """Enough nodes that each have the CPUs, GPUs and memory asked of one node."""
    mem_mb = None if s.mem_gb in (None, AUTO) else _int_setting("launcher.mem_gb", s.mem_gb, minimum=1) * 1024
    if mem_mb is not None and mem_mb > max(k.mem_mb for k in part.nodes):
        most = max(k.mem_mb for k in part.nodes) // 1024
        more = _others(cluster, part, lambda p: any(k.mem_mb >= mem_mb for k in p.nodes), "with more memory")
        raise UserError(f"launcher.mem_gb={s.mem_gb}: the nodes of partition {part.name} have at most {most} GB "
                        f"({part.describe()}). Set launcher.mem_gb={most} or less, or launcher.mem_gb=null (SLURM's "
                        f"default){more}.")
    fit_nodes = sum(k.count for k in part.nodes if k.runs(cpus, gpus, mem_mb))
    if fit_nodes < nodes:
        raise UserError(f"trainer.num_nodes={nodes}: only {fit_nodes} node{'s' * (fit_nodes != 1)} of partition "
                        f"{part.name} have {cpus} CPUs{f', {gpus} GPUs' if gpus else ''}"
                        f"{f', {s.mem_gb} GB' if mem_mb else ''} ({part.describe()}). Set "
                        f"trainer.num_nodes={fit_nodes} or fewer, or ask less of each node (launcher.cpus_per_task, "
                        "launcher.mem_gb).")


# ---- time

def _timeout(s: Settings, part: Partition, cluster: Cluster) -> int:
    limit = part.time_limit_min
    if s.timeout_min == AUTO or s.timeout_min is None:
        return limit if limit is not None else UNLIMITED_TIMEOUT_MIN
    minutes = _int_setting("launcher.timeout_min", s.timeout_min, minimum=1)
    if limit is not None and minutes > limit:
        longer = _others(cluster, part, lambda p: p.time_limit_min is None or p.time_limit_min >= minutes,
                         "with a longer limit")
        raise UserError(
            f"launcher.timeout_min={minutes}: partition {part.name} allows at most {limit} minutes "
            f"({format_minutes(limit)}). Set launcher.timeout_min={limit} or less, or launcher.timeout_min=auto (the "
            f"partition's limit): a run that needs longer is requeued at its limit and continues from its last "
            f"checkpoint, up to launcher.max_num_timeout={s.max_num_timeout} times"
            f"{longer}.")
    return minutes


def default_lead(timeout_min: int) -> int:
    """Seconds before the time limit at which SLURM signals the job: 120, at most a fifth of the limit, at least 10."""
    return max(MIN_LEAD_S, min(DEFAULT_LEAD_S, timeout_min * 60 // 5))


def _lead(s: Settings, timeout_min: int) -> int:
    if s.signal_delay_s in (AUTO, None):
        return default_lead(timeout_min)
    lead = _int_setting("launcher.signal_delay_s", s.signal_delay_s, minimum=1)
    if lead * 2 > timeout_min * 60:
        raise UserError(f"launcher.signal_delay_s={lead} with launcher.timeout_min={timeout_min}: SLURM would send the "
                        f"signal to save and requeue in the first half of each {timeout_min * 60} s attempt (or at "
                        f"once), so each requeued attempt would be stopped again with little progress. Set "
                        f"launcher.signal_delay_s={default_lead(timeout_min)} (or auto), or a longer "
                        "launcher.timeout_min.")
    return lead


# ---- helpers

def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, str) and value.isdigit())


def _int_setting(key: str, value: Any, minimum: int = 0) -> int:
    try:
        number = int(value)
        if isinstance(value, bool) or number != float(value) or number < minimum:
            raise ValueError
    except (TypeError, ValueError):
        raise UserError(f"{key}={value}: expected a whole number{f' of at least {minimum}' if minimum else ''}"
                        f"{' or auto' if key.startswith('launcher.') else ''}.") from None
    return number


def _others(cluster: Cluster, part: Partition, ok, what: str) -> str:
    """'; or launcher.partition=<name> (…), a partition {what}' listing the other partitions that qualify."""
    names = [p.name for p in cluster.partitions.values() if p is not part and ok(p)]
    if not names:
        return ""
    return f"; or launcher.partition={'|'.join(names)}, a partition {what}"
