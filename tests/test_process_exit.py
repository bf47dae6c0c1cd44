"""Every entry point ends by itself: the end of the process (app.end_process) runs in the interpreter's own order, so
idle thread-pool workers are told to stop before they are joined, and nothing waits without a bound."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import run_cli

# a script ending through run_process after `body` ran in main(); torch imported, as in every run that trains
SCRIPT = """
import atexit, sys, threading, time, torch
from concurrent.futures import ThreadPoolExecutor
from attnlab.cli.app import run_process
atexit.register(lambda: print("exit handler ran", flush=True))
POOLS = []  # kept alive, as torch keeps its compile workers' pool
def main():
{body}
run_process(main)
"""

CASES = {
    # an idle pool left open, as torch's compile workers are after a cold compile
    "idle pool": ("    POOLS.append(ThreadPoolExecutor(2, thread_name_prefix='compile-worker'))\n"
                  "    POOLS[0].submit(time.sleep, 0.1).result()\n", 0, False),
    "idle pool, then an error status": ("    POOLS.append(ThreadPoolExecutor(1))\n"
                                        "    POOLS[0].submit(int).result()\n    sys.exit(3)\n", 3, False),
    # a plain non-daemon thread that never ends: named, then the run's status after the grace period
    "stuck thread": ("    threading.Thread(target=time.sleep, args=(3600,), name='stuck-uploader').start()\n", 0, True),
    "stuck exit handler": ("    atexit.register(time.sleep, 3600)\n    sys.exit(4)\n", 4, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_process_ends_by_itself_whatever_threads_are_left(case, tmp_path):
    body, status, held = CASES[case]
    env = os.environ | {"ATTNLAB_EXIT_GRACE_S": "4", "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)], capture_output=True, text=True,
                         env=env, timeout=120, cwd=tmp_path)
    took = time.monotonic() - start
    assert out.returncode == status, (out.returncode, out.stderr[-2000:])
    notice = [line for line in out.stderr.splitlines() if "still held" in line]
    if held:
        assert len(notice) == 1 and "after 4 s" in notice[0] and f"(status {status})" in notice[0], out.stderr
        if case == "stuck thread":
            assert "threads still running: stuck-uploader" in notice[0]
            assert "exit handler ran" not in out.stdout  # the interpreter too joins threads before the handlers
        else:
            assert "an exit handler has not returned" in notice[0]
    else:
        assert not notice and "exit handler ran" in out.stdout and took < 60, (took, out.stderr[-2000:])


def _cold_env(tmp_path) -> dict[str, str]:
    """A new user's machine: empty compile, data and tokenizer caches."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "ATTNLAB_CACHE_DIR": str(tmp_path / "cache"),
            "ATTNLAB_LOG_DIR": str(tmp_path / "logs")}


@pytest.mark.slow
def test_every_entry_point_exits_by_itself_on_a_cold_machine_with_compile(tmp_path, small_data):
    """train, eval, predict and export with model.compile=true, each in a new process with empty caches (a
    cold compile starts torch's worker pools): each exits by itself, with its status, before the grace period."""
    env = _cold_env(tmp_path)
    grace = {"ATTNLAB_EXIT_GRACE_S": "600"}  # a hang shows as the test's timeout, not as a watchdog exit
    train = run_cli("train.py", "model=gpt_char", "data=tinyshakespeare", "model.n_layer=1", "model.n_head=2",
                    "model.n_embd=32", "data.block_size=32", "data.batch_size=4", "model.compile=true",
                    "trainer.max_steps=3", "trainer.limit_val_batches=1", "test=false", env=env | grace,
                    data_dir=small_data, timeout=400)
    assert train.returncode == 0 and "run directory:" in train.stdout, train.stdout[-3000:]
    ckpt = next((tmp_path / "logs").rglob("last.ckpt"))
    commands = [("eval.py", f"ckpt_path={ckpt}", "split=val", "+data.batch_size=4"),
                ("predict.py", f"ckpt_path={ckpt}", "prompt=ROMEO:", "max_new_tokens=5"),
                ("export.py", f"ckpt_path={ckpt}", "format=safetensors")]
    for script, *args in commands:
        out = run_cli(script, *args, env=env | grace, data_dir=small_data, timeout=400)
        assert out.returncode == 0 and "still held" not in out.stdout, (script, out.stdout[-3000:])
    # a refused run ends by itself too, with the status of a user's error
    bad = run_cli("train.py", "model=gpt_char", "data=tinyshakespeare", "model.compile=true", "optimizer.lr=-1",
                  env=env | grace, data_dir=small_data, timeout=400)
    assert bad.returncode == 2 and "optimizer.lr" in bad.stdout, bad.stdout[-3000:]

