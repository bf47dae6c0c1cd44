"""Shared fixtures: compose configs in-process (Hydra compose API) and run the entry points as new processes
(`run_cli`) or in the test's own process (`run_here`)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, open_dict

from attnlab.config import compose_run, register_resolvers
from fixtures import small_data  # noqa: F401  (the small made-up datasets, a session fixture)
from slurm_cluster import XDIST_GROUP as SLURM_GROUP, ClusterManager

ROOT = Path(__file__).resolve().parents[1]
# the real datasets: `make data` lays them out in ./data; the Makefile points here at ../shared/data when it exists
DATA_DIR = Path(os.environ.get("ATTNLAB_DATA_DIR") or ROOT / "data")
# CI has every dataset: there a missing one fails its tests instead of skipping them
REQUIRE_DATA = os.environ.get("ATTNLAB_REQUIRE_DATA", "") not in ("", "0")

register_resolvers()


def real_data(name: str) -> Path:
    """A real dataset under ATTNLAB_DATA_DIR, for the tests that train on it. Without it the test is skipped with
    one line naming the dataset and `make data`; with ATTNLAB_REQUIRE_DATA=1 (CI) it fails instead."""
    path = DATA_DIR / name
    if path.exists():
        return path
    msg = f"needs the {name} dataset, not found in {DATA_DIR}: run `make data` (or set ATTNLAB_DATA_DIR)"
    if REQUIRE_DATA:
        pytest.fail(msg + "; ATTNLAB_REQUIRE_DATA=1 makes a missing dataset an error")
    pytest.skip(msg)


def compose_cfg(overrides: list[str], tmp_path: Path, config_name: str = "train",
                data_dir: Path | None = None) -> DictConfig:
    """Compose like `python train.py <overrides>` would, with every output under tmp_path; the datasets are read
    from data_dir (e.g. the small_data fixture), by default ATTNLAB_DATA_DIR's real ones."""
    cfg = compose_run(overrides, tmp_path, config_name, data_dir=data_dir or DATA_DIR, log_dir=tmp_path / "logs",
                      cache_dir=tmp_path.parent / "cache")
    with open_dict(cfg):
        cfg.extras.print_config = False
    return cfg


# Linux counts in a process's peak RSS (ru_maxrss) the memory of the process it was spawned from until its exec:
# a child of pytest (over 1 GB by the end of the suite) reports at least pytest's size. Started from this small
# launcher instead, a child's peak is its own.
OWN_PEAK_LAUNCHER = ["-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]


def docs_command(page: str, start: str) -> list[str]:
    """The command of `page`'s (docs/clusters.md) bash blocks that starts with `start`, as argv: a test that runs it
    as the page shows it (tests/test_readme.py's ELSEWHERE then only composes its config)."""
    lines = [ln.strip() for ln in (ROOT / page).read_text().splitlines() if ln.strip().startswith(start)]
    assert len(lines) == 1, f"{page} shows {len(lines)} commands starting with {start!r}"
    return shlex.split(lines[0], comments=True)


def run_cli(script: str, *args: str, env: dict | None = None, timeout: int = 600, cwd: Path = ROOT,
            data_dir: Path | None = None, own_peak_memory: bool = False):
    """Run train.py / eval.py / predict.py as a user would; returns the CompletedProcess (stdout+stderr merged).
    The datasets are read from data_dir (e.g. the small_data fixture), by default ATTNLAB_DATA_DIR's real ones.
    own_peak_memory: through OWN_PEAK_LAUNCHER, for tests that read the script's peak memory."""
    full_env = os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_DATA_DIR": str(data_dir or DATA_DIR)} | (env or {})
    launcher = [sys.executable, *OWN_PEAK_LAUNCHER] if own_peak_memory else []
    # its own process group: a timeout ends what the script started too (a benchmark's train.py, DDP workers)
    proc = subprocess.Popen(
        [*launcher, sys.executable, str(ROOT / script), *args], cwd=cwd, env=full_env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def run_here(script: str, *args: str, env: dict | None = None, cwd: Path = ROOT, data_dir: Path | None = None,
             timeout: int | None = None) -> subprocess.CompletedProcess:
    """`run_cli`'s command run in this test's process, through the script's own `main()` (tests/entry_batch.py), for
    the checks that need no new process: its exit status and its output (stdout and stderr). `timeout` is run_cli's,
    unused here."""
    import entry_batch

    ran = entry_batch.run_here({"name": script, "script": script, "args": [str(a) for a in args], "cwd": str(cwd),
                                "env": {"ATTNLAB_DATA_DIR": str(data_dir or DATA_DIR)} | (env or {})})
    return subprocess.CompletedProcess([script, *args], ran["code"], ran["output"])


@pytest.fixture
def log_env(tmp_path):
    """Environment sending a subprocess's logs and caches to tmp_path."""
    return {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "ATTNLAB_CACHE_DIR": str(tmp_path / "cache")}


def wandb_offline(folder) -> dict[str, str]:
    """Environment for W&B offline with its folders (settings, cache, staging) under `folder`, away from the user's
    own."""
    return {"WANDB_API_KEY": "", "WANDB_MODE": "offline", **{f"WANDB_{k}_DIR": str(Path(folder) / "wandb-home" / k.lower())
                                                              for k in ("CONFIG", "CACHE", "DATA")}}


# quiet, quick settings for in-process training runs
FAST = ["callbacks.progress_bar=null", "callbacks.model_summary=null", "extras.print_config=false"]


@pytest.fixture
def hub_offline(monkeypatch):
    """No network to the Hugging Face hub, at once: the environment variables for new processes and the flags that
    `datasets` and `huggingface_hub` read when first imported (an earlier test may have imported them)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for module, flag in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("datasets.config", "HF_DATASETS_OFFLINE")):
        monkeypatch.setattr(f"{module}.{flag}", True, raising=False)


@pytest.fixture(scope="session")
def slurm_cluster():
    """`slurm_cluster(accounting=True|False)`: a real two-node SLURM cluster on this machine in that mode
    (tests/slurm_cluster.py); skipped with one line where it cannot start, failed with ATTNLAB_REQUIRE_SLURM=1."""
    manager = ClusterManager()
    yield manager
    manager.close()


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs two workers), each worker and every process it starts get their share of
    the cores, so that the workers side by side do not oversubscribe them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`--dist loadgroup`), the tests of a file that share one of its module-scoped fixtures (a
    trained run, a built corpus) run on one worker, so that the fixture is built once, and so do all the tests on
    the SLURM cluster (one at a time on the machine's one cluster), those without accounting last (the cluster
    restarts in another mode once, not at each); and the slow tests are handed out first, so that the workers end
    together instead of one waiting for a long test handed out last."""
    for item in items:
        fixturedefs = item._fixtureinfo.name2fixturedefs.values()
        if "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group(SLURM_GROUP))
        elif any(d.scope == "module" for defs in fixturedefs for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=lambda item: item.get_closest_marker("slurm_without_accounting") is not None)  # stable
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each kind


def pytest_collection_finish(session):
    """pytest-xdist's loadgroup marks a grouped test by its node id (`...@group`); a pytest whose node ids it cannot
    change would spread the group over the workers silently, building each module fixture once per test."""
    if os.environ.get("PYTEST_XDIST_WORKER") and session.config.getoption("dist", default="no") == "loadgroup":
        lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): this pytest and "
                                    "pytest-xdist do not work together for --dist loadgroup; install the versions "
                                    "pyproject.toml's dev extra asks for (`make install`).")


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (`run-<id>.wandb`: a header of 7 bytes, then LevelDB's log format of 32 KiB
    blocks, each record a protobuf `Record`), as W&B's own reader sees them."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, records, pending = run_file.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


@pytest.fixture(autouse=True)
def _no_command_left_over():
    """Each test starts with no command's trust decided (an in-process train(cfg) of another test sets one)."""
    from attnlab.checkpoints import trust

    trust.reset()
    yield
