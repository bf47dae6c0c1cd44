"""What a run costs on a partition's nodes, measured by its own jobs, for `launcher.timeout_min=auto` and
`launcher.mem_gb=auto`.

A run trained in a SLURM job records, when it finishes (or runs out of time), its start-up, seconds per training
step, steps per epoch and peak memory per node, in `<paths.cache_dir>/slurm/estimates.json` under the partition and
the run's `fingerprint()`: a hash of what decides a step's cost (the config less the keys that cannot change it,
`costs()`; devices, nodes and the kind of node; the data's size; the code's version). The driver and the job compute
it with the same function from the same composed config. Only a step timed on that partition's nodes is used.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import resource
import subprocess
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from attnlab.utils.dotted import select
from attnlab.utils.env import hwm_bytes
from attnlab.utils.paths import is_under

TIME_MARGIN, TIME_SLACK_S = 1.25, 120.0
MEM_MARGIN, MEM_SLACK_GB = 1.25, 1.0
MAX_DATA_ENTRIES = 10_000  # a data folder's entries looked at (breadth first, by name) for its size
# keys of the composed config that do not change what a step costs or how much memory it takes
NOT_COST_TOP = ("seed", "tags", "task_name", "paths", "logger", "extras", "launcher", "hydra", "ckpt_path", "resume",
                "train", "test", "preflight", "preflight_steps", "optimized_metric")
NOT_COST_KEYS = ("trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "trainer.min_epochs",
                 "trainer.min_steps", "trainer.devices", "trainer.num_nodes", "trainer.default_root_dir",
                 "callbacks.progress_bar", "callbacks.rich_progress_bar", "callbacks.model_summary",
                 "callbacks.lr_monitor", "callbacks.optuna_pruning")
NOT_COST_LEAVES = ("seed", "lr", "blr", "min_lr", "learning_rate", "weight_decay")
COST_EXTRAS = ("extras.float32_matmul_precision", "extras.imports")  # extras that change a step


def costs(key: str) -> bool:
    """Whether a dotted key of the composed config can change what a step costs (see the module's doc)."""
    if any(c == key or c.startswith(key + ".") or key.startswith(c + ".") for c in COST_EXTRAS):
        return True
    leaf = key.rsplit(".", 1)[-1]
    return not (key.split(".", 1)[0] in NOT_COST_TOP or key in NOT_COST_KEYS or leaf in NOT_COST_LEAVES
                or leaf.endswith("_seed"))


def fingerprint(cfg, *, devices: int, nodes: int, node: str, code: str, data: dict | None = None) -> str:
    """The run's key: its composed config as far as a step's cost goes, its devices per node and nodes, the kind of
    node (`node_type`), the size of its data (`data_size`, unless given) and its code (`code_version`)."""
    what = {"config": cost_config(cfg), "devices": int(devices), "nodes": int(nodes), "node": node,
            "data": data_size(cfg) if data is None else data, "code": code}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cost_config(cfg) -> Any:
    """The composed config's content (interpolations as written: the driver and the job read them alike), less the
    keys `costs()` leaves out."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg

    def prune(node: Any, prefix: str) -> Any:
        if not isinstance(node, dict):
            return node
        return {k: prune(v, f"{prefix}{k}.") for k, v in node.items() if costs(f"{prefix}{k}")}

    return prune(tree, "")


def data_size(cfg) -> dict[str, list[int]]:
    """{data key: [files, bytes]} for each value of the data config that names an existing file or folder (not one
    under the cache, log or output folders); a folder counts its first MAX_DATA_ENTRIES entries, breadth first."""
    from omegaconf import DictConfig, ListConfig

    skip = [Path(p).expanduser() for p in (select(cfg, f"paths.{k}") for k in ("cache_dir", "log_dir", "output_dir"))
            if isinstance(p, str) and p]
    found: dict[str, list[int]] = {}

    def walk(node, prefix: str) -> None:
        for k in (node.keys() if isinstance(node, DictConfig) else range(len(node))):
            try:
                value = node[k]
            except Exception:  # an interpolation that resolves only elsewhere: its text is in the content
                continue
            if isinstance(value, (DictConfig, ListConfig)):
                walk(value, f"{prefix}{k}.")
            elif isinstance(value, str) and ("/" in value or value.startswith(".")) and "://" not in value:
                path = Path(value).expanduser()
                if path.exists() and not any(is_under(path, s) for s in skip):
                    found[f"{prefix}{k}"] = _tree_size(path)

    data = cfg.get("data") if isinstance(cfg, DictConfig) else None
    if isinstance(data, DictConfig):
        walk(data, "")
    return found


def _tree_size(path: Path, limit: int = MAX_DATA_ENTRIES) -> list[int]:
    """[files, bytes] of a file, or of a folder's first `limit` entries (breadth first, each folder by name)."""
    try:
        if not path.is_dir():
            return [1, path.stat().st_size]
    except OSError:
        return [0, 0]
    files = size = seen = 0
    queue = deque([path])
    while queue and seen < limit:
        try:
            with os.scandir(queue.popleft()) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries[:limit - seen]:
            seen += 1
            try:
                if entry.is_dir():
                    queue.append(Path(entry.path))
                else:
                    files, size = files + 1, size + entry.stat().st_size
            except OSError:
                continue
    return [files, size]


def code_version(record: dict[str, Any]) -> str:
    """The code of a lineage record (lineage.code_record, or the job's own lineage) as the key holds it: the commits."""
    commits = [(record.get(k) or {}).get("commit") for k in ("git", "attnlab_git")]
    return json.dumps([record.get("attnlab"), *commits])


def node_type(kind) -> str:
    """A kind of node (cluster.NodeKind: as `sinfo` reports it) as the key holds it, without how many there are."""
    return f"{kind.cpus} CPUs, {kind.mem_mb} MB, {kind.gpus} GPUs {kind.gpu_type}".rstrip()


def job_node_type(env=os.environ) -> str | None:
    """The kind of node this job runs on (its rank 0's), as `sinfo` reports it for the driver; None where `sinfo`
    cannot say."""
    from attnlab.cluster.nodes import SINFO_FORMAT, parse_sinfo
    from attnlab.cluster.slurm_queue import ask

    node, partition = env.get("SLURMD_NODENAME"), env.get("SLURM_JOB_PARTITION")
    if not (node and partition):
        return None
    out = ask("sinfo", "-h", "-N", "-n", node, "-p", partition, "-o", SINFO_FORMAT)
    kinds = parse_sinfo(out.stdout).get(partition) if out is not None and out.returncode == 0 else None
    return node_type(kinds.nodes[0]) if kinds and kinds.nodes else None


def store(cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir) / "slurm" / "estimates.json"


@dataclass
class Measured:
    """What one job of a run measured on its partition's nodes."""

    startup_s: float
    step_s: float
    steps_per_epoch: float
    peak_gb: float
    job: str = ""
    ran_out: bool = False  # measured by an attempt that ran out of its time limit: its whole time over its steps
    memory_from: str = ""  # how peak_gb was measured

    def time_min(self, steps: int, lead_s: float = TIME_SLACK_S) -> int:
        """The time limit for `steps` steps: the work plus a quarter, and SLURM's warning lead after it (2 minutes,
        or the run's own `launcher.signal_delay_s` when longer: the run stops at the warning)."""
        work = (self.startup_s + steps * self.step_s) * TIME_MARGIN
        return math.ceil((work + max(TIME_SLACK_S, lead_s)) / 60)

    def mem_gb(self) -> int:
        return math.ceil(self.peak_gb * MEM_MARGIN + MEM_SLACK_GB)


def lookup(cache_dir, partition: str, key: str) -> Measured | None:
    try:
        found = json.loads(store(cache_dir).read_text())[partition][key]
        return Measured(**found)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record(cache_dir, partition: str, key: str, measured: Measured) -> None:
    """Keep what this job measured (the file locked: the jobs of a sweep finish together), in place of what an
    earlier job of the key measured; but a job that ran out of time keeps the slower rate of its attempt that did."""
    from filelock import FileLock

    from attnlab.utils import atomic

    path = store(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        old = known.get(partition, {}).get(key) or {}
        if old.get("ran_out") and old.get("job") == measured.job:
            # a later attempt of a job that ran out of time: the rate that proved too short is not restored
            measured = replace(measured, startup_s=max(measured.startup_s, old.get("startup_s", 0.0)),
                               step_s=max(measured.step_s, old.get("step_s", 0.0)), ran_out=True,
                               peak_gb=max(measured.peak_gb, old.get("peak_gb", 0.0)))
        known.setdefault(partition, {})[key] = asdict(measured)
        atomic.write_text(path, json.dumps(known, indent=1))


def run_steps(trainer: Any, measured: Measured) -> int | None:
    """The steps the run will train: trainer.max_steps, else max_epochs x the steps per epoch measured."""
    max_steps = int(trainer.get("max_steps") or -1)
    if max_steps > 0:
        return max_steps
    epochs = trainer.get("max_epochs")
    return math.ceil(int(epochs) * measured.steps_per_epoch) if epochs not in (None, -1) else None


def peak_memory_gb(tasks_per_node: int = 1, root: str | os.PathLike = "/", env=os.environ) -> tuple[float, str]:
    """(this job's peak memory on its node in GB, how it was measured), what SLURM's `--mem` (per node) must hold:
    the job's cgroup on the node (all its tasks and their children, as SLURM's task/cgroup limits them; page cache
    included); where the job has none, a task's peak x the tasks per node, a task's peak being the larger of its own
    with its loader workers' (process_peak_bytes) and SLURM's accounting's (`sstat` MaxRSS, where it samples)."""
    peak = cgroup_peak_bytes(root, env.get("SLURM_JOB_ID"))
    if peak:
        return peak / 2**30, "the job's cgroup on its node"
    task, how = process_peak_bytes(root), "a task's peak with its loader workers'"
    if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID"):
        sampled = sstat_peak_bytes(f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}")
        if sampled and sampled > task:
            task, how = sampled, "sstat's MaxRSS of a task"
    return task * tasks_per_node / 2**30, f"{how} x {tasks_per_node} task{'s' * (tasks_per_node != 1)} per node"


def cgroup_peak_bytes(root: str | os.PathLike = "/", job_id: str | None = None, pid: str = "self") -> int | None:
    """The peak memory of this SLURM job on this node as its cgroup counts it: `memory.max_usage_in_bytes` of the
    job's cgroup under the v1 memory controller (/sys/fs/cgroup/memory/...), `memory.peak` under v2 (Linux 5.19+).
    The job's cgroup is the `job_<id>` folder of this process's cgroup path (/proc/self/cgroup), where SLURM's
    task/cgroup puts each job; None where the process is in no such cgroup (SLURM without cgroups)."""
    root = Path(root)
    try:
        lines = (root / "proc" / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    places = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            places.insert(0, (root / "sys/fs/cgroup" / controllers, path, "memory.max_usage_in_bytes"))
        elif controllers == "":
            unified = root / "sys/fs/cgroup/unified"
            places.append((unified if unified.is_dir() else root / "sys/fs/cgroup", path, "memory.peak"))
    wanted = f"job_{job_id}" if job_id else None
    for base, path, name in places:
        parts = path.strip().split("/")
        ends = [i for i, part in enumerate(parts) if part == wanted or (not wanted and re.fullmatch(r"job_\d+", part))]
        if not ends:
            continue
        try:
            return int((base.joinpath(*parts[:ends[-1] + 1]) / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def process_peak_bytes(root: str | os.PathLike = "/", pid: int | None = None, finished_kb: int | None = None) -> int:
    """A task's peak resident memory: its own (VmHWM), each live descendant's (a loader's persistent workers) and the
    largest finished child's (ru_maxrss). Pages its workers share with it count again: more than it uses, not less."""
    root, pid = Path(root), pid or os.getpid()
    children: dict[int, list[int]] = {}
    for stat in root.glob("proc/[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    live, todo = 0, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        live += hwm_bytes(child, root)
        todo += children.get(child, [])
    if finished_kb is None:
        finished_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    own = hwm_bytes(pid, root) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return own + live + finished_kb * 1024


def sstat_peak_bytes(step: str, run=subprocess.run) -> int | None:
    """The largest memory of one task of a running job step (`<job>.<step>`) as SLURM's accounting sampled it
    (`sstat` MaxRSS; jobacct_gather sums each task's processes); None where accounting does not gather it."""
    try:
        out = run(["sstat", "-n", "-P", "-j", step, "--format=MaxRSS"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    sizes = [float(m[1]) * units[m[2].upper()] for m in re.finditer(r"^\s*([\d.]+)([KMGTkmgt]?)\s*$", out.stdout, re.M)]
    return int(max(sizes)) if out.returncode == 0 and sizes and max(sizes) > 0 else None


def process_age_s() -> float:
    """Seconds since this process started (its start-up before the first step, measured once training starts)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


