"""tools/pytest_cpu_time.py, the record of where the suite's CPU time goes (docs/development.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import pytest_cpu_time  # noqa: E402

TESTS = """
import subprocess, sys, time

def test_burns_in_a_child():
    # burns 0.5 s of its own CPU time, however fast the machine
    subprocess.run([sys.executable, "-c", "import time\\nwhile time.process_time() < 0.5: pass"], check=True)

def test_sleeps():
    time.sleep(0.3)
"""


@pytest.mark.slow
def test_each_test_records_the_cpu_time_of_the_processes_it_started(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS)
    env = os.environ | {"PYTHONPATH": str(ROOT / "tools"), "ATTNLAB_CPU_TIME_OUT": str(tmp_path / "cpu")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_cpu_time",
                          "test_two.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:]
    rows = {r["test"]: r for r in map(json.loads, (tmp_path / "cpu.main.jsonl").read_text().splitlines())}
    burns, sleeps = rows["test_two.py::test_burns_in_a_child"], rows["test_two.py::test_sleeps"]
    # the child's, reaped: its 0.5 s as the kernel's accounting counts them, in clock ticks (0.49 s seen)
    assert burns["cpu"] >= 0.45 and burns["machine"] >= burns["cpu"] - 0.05, burns
    assert sleeps["wall"] >= 0.3 and sleeps["cpu"] < 0.1, sleeps
    report = pytest_cpu_time.report(list(rows.values()))
    assert report.splitlines()[0].startswith("2 tests in ")
    assert report.index("test_burns_in_a_child") < report.index("test_sleeps")


def test_the_cluster_s_jobs_are_the_machine_s_time_less_the_workers():
    """A test on the worker that waits on the cluster: the machine's CPU time over it, less its own and the other
    workers' (spread over their tests' spans), is its jobs'."""
    rows = [{"test": "t.py::job@slurm_cluster", "worker": "gw0", "start": 0.0, "wall": 10.0, "cpu": 1.0,
             "machine": 19.0},
            {"test": "t.py::a", "worker": "gw1", "start": 0.0, "wall": 20.0, "cpu": 16.0, "machine": 30.0}]
    report = pytest_cpu_time.report(rows)
    assert "17 in the workers' tests, 10 in the cluster's jobs" in report.splitlines()[0], report  # 19 - 1 - 16/2
