"""Where a run came from: the command, the code (git commit, uncommitted changes), Python and the main libraries'
versions, the machine (GPUs and driver, or CPU model and threads), the host and the times. `write` keeps it as the run
folder's `lineage.json` (the diff as `lineage.diff`), the records of earlier attempts in the same folder under
`earlier`, each attempt numbered (`attempt`) and saying how it ended (`outcome`, `cause`: cluster/outcome.py)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from attnlab.cluster.outcome import RUNNING, AttemptEnd, Outcome
from attnlab.cluster.slurm_job import this_attempt
from attnlab.utils import dotted
from attnlab.utils.env import package_versions
from attnlab.utils.paths import is_under

# the libraries whose versions change results
PACKAGES = ("torch", "lightning", "hydra-core", "omegaconf", "timm", "torchmetrics", "torchvision", "transformers",
            "tokenizers", "datasets", "numpy", "optuna", "wandb", "segmentation-models-pytorch", "sacrebleu")
FILE, DIFF = "lineage.json", "lineage.diff"
_MAX_DIFF = 5 * 2**20  # a diff larger than this is cut (a generated file checked in by mistake)


def now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def collect(cwd: str | os.PathLike | None = None) -> tuple[dict[str, Any], str]:
    """(the lineage record, the uncommitted changes of the working directory's repository as a diff)."""
    import attnlab

    cwd = Path(cwd or os.getcwd())
    git, diff = _git(cwd)
    record: dict[str, Any] = {
        "command": shlex.join([Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]),
        "cwd": str(cwd),
        "attnlab": attnlab.__version__,
        "git": git,
        "python": platform.python_version(),
        "packages": package_versions(PACKAGES),
        "accelerator": _accelerator(),
        "host": socket.gethostname(),
        "os": platform.platform(),
        "started": now(),
        "ended": None,
        **RUNNING.record(),
    }
    slurm = _slurm()
    if slurm:  # a SLURM job: which one, and which of its attempts
        record["slurm"] = slurm
    for key, env in (("sweep_command", "ATTNLAB_SWEEP_COMMAND"), ("rerun_of", "ATTNLAB_RERUN_OF")):
        if os.environ.get(env):  # a job of a multirun: the sweep's own command; a rerun: the run it trains again
            record[key] = os.environ[env]
    return record | _own_checkout(git), diff


def write(run_dir: str | os.PathLike, record: dict[str, Any], diff: str = "") -> None:
    """lineage.json (and lineage.diff) in the run folder, each written whole; earlier records of the folder kept
    (under `earlier`, oldest first), each attempt numbered (`attempt`: 1, 2, ...)."""
    from attnlab.utils.atomic import write_text

    path = Path(run_dir) / FILE
    earlier = []
    if path.is_file() and "earlier" not in record:
        try:
            old = json.loads(path.read_text())
            if old.get("started") != record.get("started"):
                end = AttemptEnd.of(old)
                if end is not None and end.outcome is Outcome.RUNNING:  # it never recorded its end
                    old |= AttemptEnd(Outcome.UNRECORDED).record()
                earlier = [*old.pop("earlier", []), old]
        except (ValueError, OSError, AttributeError):
            pass
    if earlier:
        record["earlier"] = earlier
    record["attempt"] = len(record.get("earlier", [])) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=2, sort_keys=False))
    if diff:
        write_text(Path(run_dir) / DIFF, diff)


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return None


def _run(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs
        return None
    return out.stdout if out.returncode == 0 else None


def _git(cwd: Path, with_diff: bool = True) -> tuple[dict[str, Any] | None, str]:
    root = _run(["git", "rev-parse", "--show-toplevel"], cwd)
    if root is None:
        return None, ""
    commit = (_run(["git", "rev-parse", "HEAD"], cwd) or "").strip() or None
    status = _run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd) or ""
    untracked = [line[3:] for line in status.splitlines() if line.startswith("??")]
    diff = (_run(["git", "diff", "HEAD", "--no-color"], cwd) or "") if with_diff and commit else ""
    if len(diff) > _MAX_DIFF:
        diff = diff[:_MAX_DIFF] + "\n[diff cut at 5 MiB]\n"
    info = {
        "root": root.strip(),
        "commit": commit,
        "branch": (_run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd) or "").strip() or None,
        "dirty": bool(status.strip()),
        "untracked": untracked[:100],
    }
    remote = (_run(["git", "remote", "get-url", "origin"], cwd) or "").strip()
    if remote:
        info["remote"] = remote
    if diff:
        info["diff_file"] = DIFF
    return info, diff


def _slurm() -> dict[str, Any] | None:
    """The SLURM job this process runs in: its id (`<array job>_<task>` in an array), how many times SLURM has
    restarted it (requeues: SLURM_RESTART_COUNT), its nodes and partition; None outside SLURM."""
    job_id, restarts = this_attempt()
    if not job_id:
        return None
    env = os.environ
    return {
        "job_id": job_id,
        "restart_count": restarts,
        "nodes": env.get("SLURM_JOB_NODELIST"),
        "partition": env.get("SLURM_JOB_PARTITION"),
    }


def launcher_settings() -> dict[str, Any] | None:
    """The settings of the Hydra launcher that started this job (launcher=slurm's partition, nodes, tasks, CPUs,
    memory and time limit, as fitted to the partition), None for a run started directly."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        if not HydraConfig.initialized():
            return None
        node = HydraConfig.get().launcher
        target = str(node.get("_target_", ""))
        if "BasicLauncher" in target:
            return None
        settings = OmegaConf.to_container(node, resolve=True)
    except Exception:  # no Hydra run, or a launcher node that does not resolve outside its job
        return None
    return {k: v for k, v in settings.items() if isinstance(v, (str, int, float, bool))}


def _accelerator() -> dict[str, Any]:
    from attnlab.utils.cpus import usable_cpus

    info: dict[str, Any] = {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "cpus_usable": usable_cpus()}
    if "torch" in sys.modules:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cuda"] = torch.version.cuda
            driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], Path.cwd())
            if driver:
                info["driver"] = driver.splitlines()[0].strip()
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            info["gpus"] = ["Apple MPS"]
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def flatten(record: dict[str, Any] | None) -> dict[str, Any]:
    """Dotted keys of a lineage record, for comparing two runs (times and earlier records left out)."""
    kept = {k: v for k, v in (record or {}).items() if k not in ("started", "ended", "earlier")}
    return dotted.flatten(kept, keep_empty=False)


def code_record(cwd: str | os.PathLike | None = None) -> dict[str, Any]:
    """The code as the run's lineage records it (collect): attnlab's version, the working
    directory's checkout (`git`) and attnlab's own checkout where it is another one (`attnlab_git`)."""
    import attnlab

    cwd = Path(cwd or os.getcwd())
    git, _ = _git(cwd, with_diff=False)
    return {"attnlab": attnlab.__version__, "git": git, **_own_checkout(git)}


def _own_checkout(git: dict[str, Any] | None) -> dict[str, Any]:
    """{"attnlab_git": attnlab's own checkout} where it is not the working directory's checkout `git`; else {}."""
    import attnlab

    source = Path(attnlab.__file__).resolve().parents[2]
    if git is None or not is_under(source, Path(git["root"])):  # attnlab's own checkout, when it is one
        return {"attnlab_git": _git(source, with_diff=False)[0]}
    return {}
