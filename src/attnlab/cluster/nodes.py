"""What a SLURM cluster offers, as `sinfo` and `sacctmgr` report it: its partitions (nodes, CPUs, memory and GPUs per
node, time limit, which is the default) and the accounts and QOS a user may submit with."""

from __future__ import annotations

import getpass
import re
import shutil
from dataclasses import dataclass, field

from attnlab.cluster.slurm_queue import ask
from attnlab.errors import UserError

# sinfo's fields, one line per partition and kind of node: name (default marked *), availability, time limit,
# node count, CPUs, memory (MB), generic resources (GPUs)
SINFO_FORMAT = "%P|%a|%l|%D|%c|%m|%G"
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass(frozen=True)
class NodeKind:
    """Nodes of one partition that offer the same: how many, and what each has."""

    count: int
    cpus: int
    mem_mb: int
    gpus: int = 0
    gpu_type: str = ""

    def runs(self, cpus: int, gpus: int, mem_mb: int | None) -> bool:
        """Whether one such node has the CPUs, GPUs and memory (None: SLURM's default) a job asks of a node."""
        return self.cpus >= cpus and self.gpus >= gpus and (mem_mb is None or self.mem_mb >= mem_mb)


@dataclass
class Partition:
    name: str
    nodes: list[NodeKind] = field(default_factory=list)
    time_limit_min: int | None = None  # None: no limit
    default: bool = False
    available: str = "up"

    @property
    def node_count(self) -> int:
        return sum(k.count for k in self.nodes)

    @property
    def max_gpus(self) -> int:
        return max((k.gpus for k in self.nodes), default=0)

    def describe(self) -> str:
        """`debug (default): 2 nodes of 4 CPUs, 23.5 GB, no GPU; limit 1-00:00:00`"""
        kinds = "; ".join(
            f"{k.count} node{'s' * (k.count != 1)} of {k.cpus} CPUs, {k.mem_mb / 1024:.1f} GB, "
            + (f"{k.gpus} GPU{'s' * (k.gpus != 1)}{' (' + k.gpu_type + ')' if k.gpu_type else ''}" if k.gpus
               else "no GPU") for k in self.nodes) or "no nodes"
        state = "" if self.available == "up" else f"; {self.available}"
        limit = format_minutes(self.time_limit_min)
        return f"{self.name}{' (default)' if self.default else ''}: {kinds}; limit {limit}{state}"


@dataclass
class Cluster:
    """The partitions, and the accounts and QOS this user may use (None where accounting cannot say)."""

    partitions: dict[str, Partition]
    accounts: set[str] | None = None
    qos: set[str] | None = None
    user: str = ""

    @property
    def default_partition(self) -> Partition | None:
        return next((p for p in self.partitions.values() if p.default), None)


def require_slurm() -> None:
    """SLURM's commands on PATH, else the paragraph that says where to run."""
    missing = [p for p in ("sbatch", "sinfo") if shutil.which(p) is None]
    if missing:
        raise UserError(
            f"launcher=slurm submits the jobs with SLURM's commands, and {' and '.join(f'`{p}`' for p in missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not on this machine's PATH. Run the command on the cluster's "
            "login node, or make SLURM's commands available first (e.g. `module load slurm`); without a cluster, "
            "launcher=local runs the same sweep as local processes.")


def read_cluster() -> Cluster:
    require_slurm()
    out = ask("sinfo", "-a", "-h", "-o", SINFO_FORMAT, timeout=60)
    if out is None:
        raise UserError("`sinfo` did not answer within 60 s: SLURM's controller is busy or unreachable. Try again in "
                        "a moment, or ask the cluster's administrators.")
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        raise UserError(f"SLURM's controller does not answer `sinfo` ({why[-1] if why else f'exit {out.returncode}'})"
                        ": launcher=slurm cannot see the cluster's partitions. Check that SLURM is up "
                        "(`sinfo`, `scontrol ping`) and run the command again.")
    user = getpass.getuser()
    accounts, qos = read_accounting(user)
    return Cluster(parse_sinfo(out.stdout), accounts=accounts, qos=qos, user=user)


def parse_sinfo(text: str) -> dict[str, Partition]:
    """sinfo's lines (SINFO_FORMAT) -> {name: Partition}."""
    parts: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 7:
            continue
        name, avail, limit, count, cpus, mem, gres = fields
        default = name.endswith("*")
        name = name.rstrip("*")
        part = parts.setdefault(name, Partition(name, time_limit_min=parse_minutes(limit), default=default,
                                                available=avail))
        gpus, gpu_type = parse_gpus(gres)
        part.nodes.append(NodeKind(_int(count), _int(cpus), _int(mem), gpus, gpu_type))
    return parts


def parse_gpus(gres: str) -> tuple[int, str]:
    """GPUs per node from a GRES list (`gpu:8`, `gpu:a100:4(S:0-1),shard:8`, `(null)`) -> (count, type)."""
    total, types = 0, []
    for item in re.split(r",(?![^(]*\))", gres or ""):
        parts = re.sub(r"\(.*\)$", "", item.strip()).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = re.match(r"\d+", parts[-1])
        total += int(count.group()) if count else 1
        if len(parts) > 2:
            types.append(parts[1])
    return total, ",".join(types)


def parse_minutes(text: str) -> int | None:
    """SLURM's time (`1-00:00:00`, `10:00` = minutes:seconds, `2:00:00`, `30`) in whole minutes; None: no limit."""
    text = text.strip().lower()
    if text in ("infinite", "unlimited", "n/a", "none", ""):
        return None
    m = _TIME.match(text)
    if not m:
        return None
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if days is not None:  # days-hours[:minutes[:seconds]]
        return days * 1440 + a * 60 + (b or 0) + (1 if c else 0)
    if c is not None:  # hours:minutes:seconds
        return a * 60 + b + (1 if c else 0)
    if b is not None:  # minutes:seconds
        return a + (1 if b else 0)
    return a


def format_minutes(minutes: int | None) -> str:
    if minutes is None:
        return "none"
    days, rest = divmod(minutes, 1440)
    return (f"{days}-" if days else "") + f"{rest // 60:02d}:{rest % 60:02d}:00"


def read_accounting(user: str) -> tuple[set[str] | None, set[str] | None]:
    """The accounts and QOS of this user's associations (sacctmgr); (None, None) where there is no accounting."""
    if shutil.which("sacctmgr") is None:
        return None, None
    assoc = ask("sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=account,qos", timeout=20)
    if assoc is None or assoc.returncode != 0 or not assoc.stdout.strip():
        return None, None
    accounts, qos = set(), set()
    for line in assoc.stdout.splitlines():
        account, _, names = line.strip().partition("|")
        if account:
            accounts.add(account)
        qos |= {q.lstrip("+-") for q in names.split(",") if q}
    return accounts, qos or None


def _int(text: str) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0
