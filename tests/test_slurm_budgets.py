"""Budgets of requeues that hold on every rank (callbacks/peers.py's ledger), and a requeue recorded as one only when
SLURM made it (callbacks/signals.py).

Without the cluster: a fake `scontrol` on PATH answers as SLURM would and notes what it was asked. On the two-node
cluster (tools/slurm-cluster.sh): a two-node job of `launcher=slurm launcher.max_num_timeout=1` that loses rank 0's
node (n1), then rank 1's (n2), is requeued once and fails at the second loss, once, saying that its budget is spent;
the sweep driver reports it failed."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnlab import lineage
from attnlab.callbacks import peers, signals
from attnlab.callbacks.peers import PeerWatch
from attnlab.callbacks.run_metadata import ledger_of, requeue_budget
from attnlab.cluster import slurm_job
from attnlab.cluster.outcome import UNRECORDED_TEXT, Cause
from attnlab.cluster.slurm_job import LOST, RUNNING, TIME_LIMIT, Ledger
from attnlab.callbacks.run_metadata import RunMetadata
from attnlab.callbacks.signals import SignalGuard
from slurm_cluster import start_daemon

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
    for module in (signals, peers):
        monkeypatch.setattr(module, "in_slurm_job", lambda: True)
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

    monkeypatch.setattr("attnlab.cluster.exit.end_at_once", end)
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
    assert calls.count("update JobId=77 Requeue=0") == 1, calls
    notes = sorted(p.name for p in (tmp_path / slurm_job.LEDGER).iterdir())  # the third: the loss that failed it
    assert notes == ["77.0.json", "77.1.json", "77.2.json"], notes
    assert {json.loads((tmp_path / slurm_job.LEDGER / n).read_text())["cause"] for n in notes} == {LOST}
    record = lineage.read(tmp_path)
    assert [r["status"] for r in record["earlier"]] == ["requeued: a peer was lost"] * 2, record["earlier"]
    assert record["status"] == "failed: a peer was lost, not requeued", record
    assert "launcher.max_num_timeout=2" in record["not_requeued"] and record["requeues_spent"] == 2, record
    assert record["slurm"]["restart_count"] == 2 and record["attempt"] == 3
    if survivor:
        assert record["recorded_by_rank"] == 1
    said = [ln for ln in capfd.readouterr().err.splitlines() if "The job fails and is not requeued: " in ln]
    assert len(said) == 1 and said[0].startswith("attnlab: ") and "lost peer or node 2 times already" in said[0], said
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
    Ledger(tmp_path).note(Cause.PREEMPTED)
    assert Ledger(tmp_path).spent(LOST) == 1 and Ledger(tmp_path).spent(Cause.PREEMPTED) == 0  # its own: not before it
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    Ledger(tmp_path).note(TIME_LIMIT)
    assert (Ledger(tmp_path).spent(LOST), Ledger(tmp_path).spent(Cause.PREEMPTED), Ledger(tmp_path).spent(TIME_LIMIT)) \
        == (1, 1, 0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    for rank in (0, 1):  # what each rank's PeerWatch reads
        trainer = _trainer(tmp_path, rank, {"max_num_timeout": 2})
        assert ledger_of(trainer).spent(LOST) == 1 and ledger_of(trainer).spent(TIME_LIMIT) == 1
        assert requeue_budget(trainer) == (2, "launcher.max_num_timeout=2")
    assert requeue_budget(_trainer(tmp_path, 1))[0] == slurm_job.DEFAULT_MAX_REQUEUES  # a batch script of one's own
    (tmp_path / slurm_job.LEDGER / "77.1.json").write_text("{half")  # unreadable: not counted, not an error
    assert Ledger(tmp_path).spent(Cause.PREEMPTED) == 0


def test_an_attempt_that_ended_without_a_word_counts_as_a_lost_peer(tmp_path, slurm, monkeypatch):
    """SLURM requeued the job itself (its batch host lost before a surviving rank asked): the attempt's record,
    written by rank 0 as it began training, still says `running`, and the next attempts count it as a lost peer. A
    SIGTERM (scancel, an admin's requeue) is noted at once and not counted, nor is a peer's own failure, which
    replaces the note of a lost peer written as the collective broke."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    PeerWatch().setup(_trainer(tmp_path, 0), None, "fit")  # and nothing more: its node lost, SLURM requeued it
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    trainer = _trainer(tmp_path, 0)
    PeerWatch().setup(trainer, None, "fit")
    guard = SignalGuard()
    guard._trainer = trainer
    guard.on_sigterm(signal.SIGTERM, None)  # stopped by an admin's scontrol requeue
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    trainer, watch = _trainer(tmp_path, 0), PeerWatch(wait_s=0)
    watch.setup(trainer, None, "fit")
    (tmp_path / ".ranks").mkdir(exist_ok=True)
    (tmp_path / ".ranks" / f"{watch.attempt()}.rank1.json").write_text('{"rank": 1, "error": "ValueError: bug"}')
    watch.on_exception(trainer, None, RuntimeError("gloo: Connection closed by peer"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    causes = [r["cause"] for r in Ledger(tmp_path).earlier()]
    assert causes == [RUNNING, "SIGTERM", "a rank failed"], causes
    assert Ledger(tmp_path).spent(LOST) == 1


@pytest.mark.parametrize("rank", [0, 1])
def test_an_attempt_slurm_starts_past_the_budget_fails_before_training(tmp_path, slurm, monkeypatch, capfd, rank):
    """Rank 0's node lost three times, its surviving rank ended each time before it could decide (SLURM requeued the
    job itself on the node failure: three records still `running`) under max_num_timeout=2: the third attempt trains
    (two requeues spent, the budget), the fourth fails as it sets up, on every rank alike, with status 1, the job
    made non-requeueable; rank 0 says why, once, and records it."""
    launcher = {"max_num_timeout": 2}
    for restart in range(3):
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
        PeerWatch().setup(_trainer(tmp_path, 0, launcher), None, "fit")  # began training, then nothing more
    assert "Requeue=0" not in slurm.read_text()  # up to the budget: attempts 2 and 3 trained
    ended = []

    def end(code):
        ended.append(code)
        raise SystemExit(code)

    monkeypatch.setattr("attnlab.cluster.exit.end_at_once", end)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    with pytest.raises(SystemExit):
        PeerWatch().setup(_trainer(tmp_path, rank, launcher), None, "fit")
    assert ended == [1] and slurm.read_text().splitlines()[-1] == "update JobId=77 Requeue=0"
    said = [ln for ln in capfd.readouterr().err.splitlines() if "The job fails and is not requeued: " in ln]
    record = lineage.read(tmp_path)
    if rank:  # quiet: rank 0, up in the same attempt, says it
        assert not said and record["status"] == "running", (said, record)
        return
    assert len(said) == 1 and "requeued for a lost peer or node 3 times already, past the budget" in said[0], said
    assert record["status"] == "failed: a peer was lost, not requeued" and record["requeues_spent"] == 3, record


def test_how_long_a_surviving_rank_waits_for_a_peers_note_is_set_by_the_environment(monkeypatch, capsys):
    """10 s by default; ATTNLAB_PEER_NOTE_WAIT_S sets it; a value that is not a number is said, and 10 s used."""
    monkeypatch.delenv("ATTNLAB_PEER_NOTE_WAIT_S", raising=False)
    assert PeerWatch().wait_s == 10
    monkeypatch.setenv("ATTNLAB_PEER_NOTE_WAIT_S", "30")
    assert PeerWatch().wait_s == 30
    monkeypatch.setenv("ATTNLAB_PEER_NOTE_WAIT_S", "ten")
    assert PeerWatch().wait_s == 10
    assert capsys.readouterr().err == "attnlab: ATTNLAB_PEER_NOTE_WAIT_S='ten' is not a number of seconds; waiting 10 s\n"


def test_the_sigterm_of_a_requeue_asked_for_a_lost_peer_leaves_its_note(tmp_path, slurm, monkeypatch):
    """The requeue's SIGTERM reaches the surviving rank before it has ended: the ledger keeps the lost peer."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert _lose_a_peer(tmp_path, 1, {"max_num_timeout": 2}, monkeypatch)
    guard = SignalGuard()
    guard._trainer = _trainer(tmp_path, 1)
    guard.on_sigterm(signal.SIGTERM, None)
    assert [r["cause"] for r in Ledger(tmp_path).earlier()] == []  # this attempt's own: not an earlier one
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert [r["cause"] for r in Ledger(tmp_path).earlier()] == [LOST]


def _warned(tmp_path: Path, sig: int = signal.SIGTERM, preempted: bool = True, launcher: dict | None = None,
            handler=None):
    trainer = _trainer(tmp_path, 0, launcher, step=12)
    guard = SignalGuard()
    guard._trainer, guard.warned, guard.warned_at, guard.preempted = trainer, sig, time.time(), preempted
    guard._submitit = handler
    guard.requeue(trainer)
    return lineage.read(tmp_path)


@pytest.mark.parametrize(("flag", "mode", "why"), [
    ("0", "REQUEUE", "Requeue=0"), ("1", "CANCEL", "PreemptMode=CANCEL")])
def test_a_preemption_that_slurm_does_not_requeue_is_recorded_as_stopped(tmp_path, slurm, monkeypatch, capfd, flag,
                                                                         mode, why):
    """SLURM's SIGTERM of a preemption, `scontrol requeue` refused: the job cannot be requeued (--no-requeue) or its
    partition cancels what it preempts. The lineage says so, not `requeued: preempted`."""
    monkeypatch.setenv("FAKE_REQUEUE_ERROR", "Requested operation is presently disabled for job 77")
    monkeypatch.setenv("FAKE_PREEMPT_TIME", "2026-11-29T08:29:17")
    monkeypatch.setenv("FAKE_REQUEUE_FLAG", flag)
    monkeypatch.setenv("FAKE_PREEMPT_MODE", mode)
    record = _warned(tmp_path)
    assert record["status"] == "stopped: preempted, not requeued" and record["signal"] == "SIGTERM", record
    assert why in record["not_requeued"] and "presently disabled" in record["not_requeued"], record
    assert not (tmp_path / slurm_job.LEDGER).exists() or not list((tmp_path / slurm_job.LEDGER).iterdir())
    err = capfd.readouterr().err
    assert "attnlab: SIGTERM (preempted): " in err and "The job is not requeued: " in err, err


def test_a_preemption_that_slurm_requeues_itself_is_recorded_as_requeued(tmp_path, slurm, monkeypatch):
    """`scontrol requeue` refused as the job is requeued already (SLURM's own requeue of a preempted job), or
    refused otherwise while SLURM preempts it under PreemptMode=REQUEUE: requeued: preempted."""
    monkeypatch.setenv("FAKE_PREEMPT_TIME", "2026-11-29T08:29:17")
    monkeypatch.setenv("FAKE_REQUEUE_ERROR", "Job is pending execution for job 77")
    assert _warned(tmp_path)["status"] == "requeued: preempted"
    monkeypatch.setenv("FAKE_REQUEUE_ERROR", "Unexpected message received")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert _warned(tmp_path)["status"] == "requeued: preempted"
    monkeypatch.setenv("FAKE_PREEMPT_MODE", "CANCEL")  # the same refusal where a preemption cancels
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert _warned(tmp_path)["status"] == "stopped: preempted, not requeued"


class FakeSubmitit:
    """submitit's SignalHandler as SignalGuard uses it: its walltime heuristic says `timed_out`; its requeue
    records the countdown it was given and exits as submitit does."""

    def __init__(self, timed_out: bool, countdown: int):
        self.timed_out, self._delayed = timed_out, SimpleNamespace(_timeout_countdown=countdown)
        self.asked: list[tuple[bool, int]] = []

    def has_timed_out(self) -> bool:
        return self.timed_out

    def checkpoint_and_try_requeue(self, signum) -> None:
        timed_out = self.has_timed_out()
        self.asked.append((timed_out, self._delayed._timeout_countdown - timed_out))
        subprocess.run(["scontrol", "requeue", "77"], check=True)
        raise SystemExit(-1)


def _end_time(seconds_from_now: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds_from_now).isoformat(timespec="seconds")


def test_under_launcher_slurm_attnlab_tells_a_time_limit_and_counts_it_in_the_ledger(tmp_path, slurm, monkeypatch):
    """A late preemption (submitit's heuristic would call it a time limit) is a preemption, not counted; a warning
    within signal_delay_s of the end time is a time limit, counted in the ledger and handed to submitit with the
    countdown the ledger leaves; past launcher.max_num_timeout it is not requeued."""
    launcher = {"max_num_timeout": 1, "signal_delay_s": 30}
    monkeypatch.setenv("FAKE_PREEMPT_TIME", "2026-11-29T08:29:17")
    monkeypatch.setenv("FAKE_END_TIME", _end_time(30))  # a preemption's end: its grace time
    late = FakeSubmitit(timed_out=True, countdown=1)
    record = _warned(tmp_path, signal.SIGUSR1, preempted=False, launcher=launcher, handler=late)
    assert record["status"] == "requeued: preempted" and late.asked == [(False, 1)], (record, late.asked)

    monkeypatch.delenv("FAKE_PREEMPT_TIME")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("FAKE_END_TIME", _end_time(3600))  # a warning by hand, an hour before the end
    early = FakeSubmitit(timed_out=True, countdown=1)
    assert _warned(tmp_path, signal.SIGUSR1, False, launcher, early)["status"] == "requeued: preempted"

    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("FAKE_END_TIME", _end_time(60))  # SLURM's warning of the time limit
    limit = FakeSubmitit(timed_out=False, countdown=1)
    record = _warned(tmp_path, signal.SIGUSR1, False, launcher, limit)
    assert record["status"] == "requeued: time limit" and limit.asked == [(True, 0)], (record, limit.asked)

    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")  # its pickle still says 1 left (written elsewhere): ledger wins
    again = FakeSubmitit(timed_out=False, countdown=1)
    record = _warned(tmp_path, signal.SIGUSR1, False, launcher, again)
    assert record["status"] == "stopped: time limit, not requeued" and not again.asked, record
    assert "launcher.max_num_timeout times already (1 requeues for a time limit" in record["not_requeued"], record
    causes = [json.loads(p.read_text())["cause"] for p in sorted((tmp_path / slurm_job.LEDGER).iterdir())]
    assert causes == ["preempted", "preempted", TIME_LIMIT], causes

    monkeypatch.setenv("SLURM_RESTART_COUNT", "4")  # submitit requeued on its own before training: counted too
    monkeypatch.setenv("SLURM_JOB_ID", "79")
    own = FakeSubmitit(timed_out=False, countdown=0)
    assert _warned(tmp_path, signal.SIGUSR1, False, launcher, own)["status"] == "stopped: time limit, not requeued"


def test_in_a_batch_script_of_ones_own_a_refused_requeue_is_not_recorded_as_one(tmp_path, slurm, monkeypatch):
    monkeypatch.setenv("FAKE_REQUEUE_ERROR", "Requested operation is presently disabled for job 77")
    monkeypatch.setenv("FAKE_REQUEUE_FLAG", "0")
    record = _warned(tmp_path, signal.SIGUSR1, preempted=False)
    assert record["status"] == "stopped: SLURM's warning, not requeued" and "Requeue=0" in record["not_requeued"]
    monkeypatch.delenv("FAKE_REQUEUE_ERROR")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert _warned(tmp_path, signal.SIGUSR1, preempted=False)["status"] == "requeued: SLURM's warning"


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


LOSSES = ("n1", "n2")  # the node lost in each attempt: rank 0's, then rank 1's (its rank 0 records the last attempt's
# failure: a rank 0 lost with its node records nothing)


def _survivor(node: str) -> int:
    """The rank left when `node` is lost."""
    return 1 if node == "n1" else 0


@pytest.mark.slow
def test_a_two_node_job_losing_either_node_again_and_again_is_requeued_until_its_budget_then_fails_once(
        slurm_cluster, tmp_path):
    """launcher.max_num_timeout=1, a node lost in each attempt (its slurmd and the job's processes on it killed, back
    once the rank left has decided): rank 0's node n1, where no rank 0 is left to record anything, then rank 1's n2.
    The job is requeued once, losses of either node counted together; at the second loss it fails, once, saying its
    budget is spent; it is not requeued again, and the sweep driver reports it failed at once (SLURM will not requeue
    it: Requeue=0)."""
    from test_slurm_preemption import PACE, Sweep, paced
    from test_slurm_strict import TWO_NODES, _lose_node, until_decided

    slurm_cluster(accounting=True)
    (tmp_path / "pace.py").write_text(PACE)
    (tmp_path / "step_note.py").write_text(STEP_NOTE)
    note = tmp_path / "steps.txt"
    sweep = Sweep(tmp_path, "lost", *paced(1.0), "+callbacks.note._target_=step_note.StepNote",
                  f"+callbacks.note.note={note}", f"launcher.max_num_timeout={len(LOSSES) - 1}", run=TWO_NODES)
    try:
        job = sweep.job_id()
        for restart, node in enumerate(LOSSES):
            _until_both_ranks_train(sweep, note, restart)
            _lose_node(job, node)
            try:
                until_decided(sweep.run_dir / ".requeues" / f"{job}.{restart}.json", job, "n2" if node == "n1" else "n1")
            finally:
                start_daemon("slurmd", "-N", node)
        out = sweep.wait(timeout=900)
    finally:
        sweep.stop()
    log = sweep.log()
    assert sweep.proc.returncode == 1, out[-3000:] + log[-3000:]
    attempts = sweep.attempts()
    statuses = [a["status"] for a in attempts]
    # rank 0's node lost, the rank left may be ended with the step before it decides (srun, on n1, is gone too):
    # SLURM requeues the job itself on the node failure, the attempt ends unrecorded and counts all the same. Rank
    # 1's node lost, rank 0 always records the requeue, and the last loss (n2) the failure
    silent = [s == UNRECORDED_TEXT for s in statuses[:-1]]
    assert set(statuses[:-1]) <= {"requeued: a peer was lost", UNRECORDED_TEXT}, statuses
    assert not any(quiet and node == "n2" for quiet, node in zip(silent, LOSSES)), statuses
    assert statuses[-1] == "failed: a peer was lost, not requeued", (attempts, log[-3000:])
    assert len(attempts) == len(LOSSES), statuses
    assert [a["slurm"]["restart_count"] for a in attempts] == list(range(len(attempts))), attempts
    assert f"launcher.max_num_timeout={len(LOSSES) - 1}" in attempts[-1]["not_requeued"], attempts[-1]
    ledger = sorted(p.name for p in (sweep.run_dir / ".requeues").iterdir())
    assert ledger == [f"{job}.{n}.json" for n in range(len(LOSSES))], ledger
    notes = [json.loads((sweep.run_dir / ".requeues" / n).read_text()) for n in ledger]
    # who wrote the notes: the rank left
    assert all(n["cause"] == LOST and n["rank"] == _survivor(node) or n["cause"] == RUNNING and quiet
               for n, node, quiet in zip(notes, LOSSES, [*silent, False])), notes
    assert all(a.get("recorded_by_rank", 0) == _survivor(node) for a, node in zip(attempts, LOSSES)
               if a["status"] != UNRECORDED_TEXT), attempts
    said = [ln for ln in log.splitlines() if "The job fails and is not requeued: " in ln]
    assert len(said) == 1 and f"requeued for a lost peer or node {len(LOSSES) - 1} times already" in said[0], \
        log[-3000:]
    requeued = [ln for ln in out.splitlines() if f"job {job} (#0): requeued" in ln]
    assert len(requeued) == len(attempts) - 1 and "1 of 1 SLURM jobs of this sweep did not complete" in out, \
        out[-3000:]
    time.sleep(5)  # not requeued by SLURM either (Requeue=0): it stays ended, after its last attempt
    runs = subprocess.run(["sacct", "-j", job, "-D", "-X", "-n", "-P", "-o", "State"], capture_output=True,
                          text=True).stdout.split()
    # an attempt ended unrecorded was requeued by SLURM itself on the node failure: sacct says NODE_FAIL for it
    assert all(state == "REQUEUED" or state == "NODE_FAIL" and quiet for state, quiet in zip(runs[:-1], silent)), runs
    assert len(runs) == len(attempts) and runs[-1] in ("COMPLETED", "FAILED", "NODE_FAIL"), runs
    assert squeue_state(job) is None, squeue_state(job)
    print(*(ln.strip() for ln in out.splitlines() if f"job {job}" in ln or ln.startswith("attnlab:")), *said, sep="\n")
