"""Budgets of requeues that hold on every rank (callbacks/peers.py's ledger), and a requeue recorded as one only when
SLURM made it (callbacks/signals.py).

Without the cluster: a fake `scontrol` on PATH answers as SLURM would and notes what it was asked. On the two-node
cluster (tools/slurm-cluster.sh): a two-node job of `launcher=slurm launcher.max_num_timeout=2` that loses the same
node three times, rank 0's (n1) or rank 1's (n2), is requeued twice and fails at the third loss, once, saying that
its budget is spent; the sweep driver reports it failed."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnlab import lineage
from attnlab.callbacks import peers, signals
from attnlab.callbacks.peers import LOST, TIME_LIMIT, Ledger, PeerWatch
from attnlab.callbacks.run_metadata import RunMetadata

SCONTROL = """#!/bin/sh
echo "$*" >> "$FAKE_SCONTROL_LOG"
case "$1 $2" in
  "requeue "*) if [ -n "$FAKE_REQUEUE_ERROR" ]; then echo "$FAKE_REQUEUE_ERROR" >&2; exit 1; fi ;;
  "show job") echo "JobId=$3 JobState=${FAKE_JOB_STATE:-RUNNING} Requeue=${FAKE_REQUEUE_FLAG:-1} \
Restarts=${SLURM_RESTART_COUNT:-0} PreemptTime=${FAKE_PREEMPT_TIME:-None} EndTime=${FAKE_END_TIME:-Unknown} \
Partition=low" ;;
  "show partition") echo "PartitionName=$3 PreemptMode=${FAKE_PREEMPT_MODE:-REQUEUE}" ;;
  "show config") echo "PreemptMode             = ${FAKE_PREEMPT_MODE:-REQUEUE}" ;;
esac
exit 0
"""


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """A SLURM job's environment (job 77, not requeued yet) and a fake scontrol; -> the file of its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    calls = tmp_path / "scontrol.calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_SCONTROL_LOG", str(calls))
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "FAKE_REQUEUE_ERROR",
                 "FAKE_PREEMPT_TIME", "FAKE_END_TIME", "FAKE_REQUEUE_FLAG", "FAKE_PREEMPT_MODE", "FAKE_JOB_STATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setattr(signals, "in_slurm_job", lambda: True)
    handler = signal.getsignal(signal.SIGTERM)
    yield calls
    signal.signal(signal.SIGTERM, handler)  # SignalGuard.requeue takes SIGTERM over


def _trainer(run_dir: Path, rank: int, launcher: dict | None = None, step: int = 5):
    """A trainer as the callbacks see it: its rank, its step and the run's metadata (rank 0's record of this
    attempt written to lineage.json, as RunMetadata.setup does)."""
    metadata = RunMetadata({"paths": {"output_dir": str(run_dir)}})
    metadata.lineage, _ = lineage.collect(run_dir)
    metadata.lineage["started"] += f" #{time.monotonic_ns()}"  # each attempt its own start
    if launcher is not None:
        metadata.lineage["launcher"] = launcher
    # rank 0's record of this attempt, written as training starts (rank 1's own stays in its memory)
    lineage.write(run_dir, metadata.lineage if rank == 0 else dict(metadata.lineage, host="rank 0's"))
    return SimpleNamespace(callbacks=[metadata], global_rank=rank, is_global_zero=rank == 0, global_step=step,
                           world_size=2, checkpoint_callback=None, default_root_dir=str(run_dir))


def _lose_a_peer(run_dir: Path, rank: int, launcher: dict | None, monkeypatch) -> bool:
    """PeerWatch on `rank` meets a lost peer: -> whether it ended the process to be requeued (status 143), not as
    failed (status 1)."""
    ended = []

    def end(code):
        ended.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(signals, "end_at_once", end)
    trainer = _trainer(run_dir, rank, launcher)
    error = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [n1]:1234")
    try:
        PeerWatch(wait_s=0).on_exception(trainer, None, error)
    except SystemExit:
        pass
    assert len(ended) == 1 and ended[0] in (1, 143), ended
    return ended == [143]


@pytest.mark.parametrize("survivor", [0, 1])
def test_the_lost_peer_budget_holds_on_every_rank_whichever_rank_was_lost(tmp_path, slurm, monkeypatch, capfd,
                                                                         survivor):
    """Each attempt loses a peer and the surviving rank (rank 1 when rank 0's node is the one lost: no record of
    rank 0's at all) counts the job's earlier requeues from the ledger: requeued twice under max_num_timeout=2, then
    the job fails once, saying so, made non-requeueable (Requeue=0) so that SLURM does not requeue it either."""
    launcher = {"max_num_timeout": 2}
    for restart in range(3):
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
        requeued = _lose_a_peer(tmp_path, survivor, launcher, monkeypatch)
        assert requeued == (restart < 2), restart
    calls = slurm.read_text().splitlines()
    assert calls.count("requeue 77") == 2 and calls[-1] == "update JobId=77 Requeue=0", calls
    notes = sorted(p.name for p in (tmp_path / peers.LEDGER).iterdir())
    assert notes == ["77.0.json", "77.1.json"], notes
    assert {json.loads((tmp_path / peers.LEDGER / n).read_text())["cause"] for n in notes} == {LOST}
    record = lineage.read(tmp_path)
    assert [r["status"] for r in record["earlier"]] == ["requeued: a peer was lost"] * 2, record["earlier"]
    assert record["status"] == "failed: a peer was lost, not requeued", record
    assert "launcher.max_num_timeout=2" in record["not_requeued"] and record["requeues_spent"] == 2, record
    assert record["slurm"]["restart_count"] == 2 and record["attempt"] == 3
    if survivor:
        assert record["recorded_by_rank"] == 1
    said = [ln for ln in capfd.readouterr().err.splitlines() if "The job fails and is not requeued: " in ln]
    assert len(said) == 1 and said[0].startswith("attnlab: ") and "2 times already" in said[0], said
    assert said[0].endswith("No checkpoint was saved yet. Exit status 1."), said


def test_every_rank_computes_the_same_spent_from_the_ledger(tmp_path, slurm, monkeypatch):
    """Rank 0's lineage records the requeue of attempt 0 only in its own memory; rank 1, which never read it, counts
    it all the same: the ledger is one file per attempt, read by attempt number. Other jobs' notes, this attempt's
    own note and preemptions are not counted."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    Ledger(tmp_path).note(LOST, rank=1)  # written by rank 1: rank 0's node was the one lost
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    Ledger(tmp_path).note(LOST)  # another job in the same folder (a rerun)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    Ledger(tmp_path).note("preempted")
    assert Ledger(tmp_path).spent(LOST) == 1 and Ledger(tmp_path).spent("preempted") == 0  # its own: not before it
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    Ledger(tmp_path).note(TIME_LIMIT)
    assert (Ledger(tmp_path).spent(LOST), Ledger(tmp_path).spent("preempted"), Ledger(tmp_path).spent(TIME_LIMIT)) \
        == (1, 1, 0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    for rank in (0, 1):  # what each rank's PeerWatch reads
        trainer = _trainer(tmp_path, rank, {"max_num_timeout": 2})
        assert Ledger.of(trainer).spent(LOST) == 1 and Ledger.of(trainer).spent(TIME_LIMIT) == 1
        assert peers.max_requeues(trainer) == (2, "launcher.max_num_timeout=2")
    assert peers.max_requeues(_trainer(tmp_path, 1))[0] == peers.DEFAULT_MAX_REQUEUES  # a batch script of one's own
    (tmp_path / peers.LEDGER / "77.1.json").write_text("{half")  # unreadable: not counted, not an error
    assert Ledger(tmp_path).spent("preempted") == 0


# a user's callback noting each training step of each rank: "<restart count> <rank> <step>" a line
STEP_NOTE = '''
import os

from lightning.pytorch.callbacks import Callback


class StepNote(Callback):
    def __init__(self, note: str):
        self.note = note

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with open(self.note, "a") as f:
            f.write(f"{os.environ.get('SLURM_RESTART_COUNT', '0')} {trainer.global_rank} {trainer.global_step}\\n")
'''


def squeue_state(job: str) -> str | None:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip() or None


def _until_both_ranks_train(sweep, note: Path, restart: int, timeout: float = 300) -> None:
    """Until each rank of the job's attempt `restart` has done two training steps."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [ln.split() for ln in note.read_text().splitlines()] if note.is_file() else []
        ranks = {rank for r, rank, step in lines if int(r) == restart and int(step) >= 2}
        if ranks == {"0", "1"}:
            return
        assert time.monotonic() < deadline and sweep.proc.poll() is None, \
            f"attempt {restart} never trained on both ranks:\n{sweep.out()[-2000:]}\n{sweep.log()[-3000:]}"
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("node", ["n2", "n1"])
def test_a_two_node_job_losing_the_same_node_three_times_is_requeued_twice_then_fails_once(slurm_cluster, tmp_path,
                                                                                         node):
    """launcher.max_num_timeout=2, the same node lost in each attempt (its slurmd and the job's processes on it
    killed, the node back 15 s later): rank 1's node n2, or rank 0's node n1, where no rank 0 is left to record
    anything. The job is requeued twice; at the third loss it fails, once, saying its budget is spent; it is not
    requeued again, and the sweep driver reports it failed."""
    from test_slurm_preemption import PACE, Sweep, paced
    from test_slurm_strict import TWO_NODES, _lose_node

    slurm_cluster(accounting=True)
    (tmp_path / "pace.py").write_text(PACE)
    (tmp_path / "step_note.py").write_text(STEP_NOTE)
    note = tmp_path / "steps.txt"
    sweep = Sweep(tmp_path, f"lost_{node}", *paced(1.0), "+callbacks.note._target_=step_note.StepNote",
                  f"+callbacks.note.note={note}", "launcher.max_num_timeout=2", run=TWO_NODES)
    try:
        job = sweep.job_id()
        for restart in range(3):
            _until_both_ranks_train(sweep, note, restart)
            _lose_node(job, node)
            try:
                time.sleep(15)
            finally:
                subprocess.run(["slurmd", "-N", node], check=True)
        out = sweep.wait(timeout=900)
    finally:
        sweep.stop()
    log = sweep.log()
    assert sweep.proc.returncode == 1, out[-3000:] + log[-3000:]
    attempts = sweep.attempts()
    assert [a["status"] for a in attempts] == ["requeued: a peer was lost"] * 2 + [
        "failed: a peer was lost, not requeued"], (attempts, log[-3000:])
    assert [a["slurm"]["restart_count"] for a in attempts] == [0, 1, 2], attempts
    assert "launcher.max_num_timeout=2" in attempts[-1]["not_requeued"], attempts[-1]
    ledger = sorted(p.name for p in (sweep.run_dir / ".requeues").iterdir())
    assert ledger == [f"{job}.0.json", f"{job}.1.json"], ledger
    said = [ln for ln in log.splitlines() if "The job fails and is not requeued: " in ln]
    assert len(said) == 1 and "requeued for a lost peer 2 times already" in said[0], log[-3000:]
    requeued = [ln for ln in out.splitlines() if ": requeued (a peer was lost" in ln]
    assert len(requeued) == 2 and "1 of 1 SLURM jobs of this sweep did not complete" in out, out[-3000:]
    time.sleep(15)  # not requeued by SLURM either (Requeue=0): it stays ended, after its third attempt
    runs = subprocess.run(["sacct", "-j", job, "-D", "-X", "-n", "-P", "-o", "State"], capture_output=True,
                          text=True).stdout.split()
    assert runs[:2] == ["REQUEUED", "REQUEUED"] and len(runs) == 3 and runs[2] in ("COMPLETED", "FAILED", "NODE_FAIL"), \
        runs
    assert squeue_state(job) is None, squeue_state(job)
    print(*(ln.strip() for ln in out.splitlines() if f"job {job}" in ln or ln.startswith("attnlab:")), *said, sep="\n")
