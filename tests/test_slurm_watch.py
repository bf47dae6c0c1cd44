"""The sweep driver of launcher=slurm follows its jobs through what the controller says, and takes nothing it cannot
say for an answer: an outage of slurmctld, a result file not visible yet, a state SLURM may requeue from. Scripted
answers of squeue and sacct, the driver's own code (the cluster tests run the same on the real cluster)."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnlab.cluster.outcome import RUNNING, AttemptEnd, Cause, SlurmState, Outcome
from attnlab.cluster import slurm_queue, sweep_states as machine, sweep_watch as sl

LOST_REQUEUED = AttemptEnd(Outcome.REQUEUED, Cause.PEER_LOST)


class FakeJob:
    def __init__(self, job_id: str, folder: Path):
        self.job_id, self.num_tasks = job_id, 1
        self.paths = SimpleNamespace(stdout=folder / f"{job_id}_log.out", result_pickle=folder / f"{job_id}_result.pkl")


def script(monkeypatch, answers: list, sacct: dict | None = None, on_poll=None):
    """squeue answers one poll after another (None: the controller down), the last repeated."""
    polls = []

    def queue_states(ids):
        polls.append(list(ids))
        if on_poll:
            on_poll(len(polls))
        answer = answers[min(len(polls), len(answers)) - 1]  # as squeue's answer is read: a SlurmState a job
        return None if answer is None else {k: slurm_queue.Queued(SlurmState(v[0]), *v[1:])
                                            for k, v in answer.items() if k in ids}

    monkeypatch.setattr(slurm_queue, "queue_states", queue_states)
    monkeypatch.setattr(slurm_queue, "accounting_on", lambda: sacct is not None)
    monkeypatch.setattr(slurm_queue, "sacct_state",
                        lambda job_id: SlurmState((sacct or {})[job_id]) if job_id in (sacct or {}) else None)
    monkeypatch.setattr(slurm_queue, "requeueable", lambda job_id: None)  # scontrol says nothing of the Requeue flag
    monkeypatch.setattr(slurm_queue, "QUEUE", slurm_queue.SharedQueue())
    clock = FakeClock()
    monkeypatch.setattr(sl, "time", clock)
    monkeypatch.setattr(machine, "time", clock)
    monkeypatch.setattr(slurm_queue, "time", clock)
    return polls


class FakeClock:
    """time.monotonic and time.sleep of the driver: a sleep moves the clock, at once."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def finish(job: FakeJob, value="done"):
    job.paths.result_pickle.write_bytes(pickle.dumps(("success", value)))


def watched(tmp_path, *ids):
    return [sl.Watched(FakeJob(i, tmp_path), n, [f"seed={n}"], set()) for n, i in enumerate(ids)]


def test_a_controller_outage_is_waited_out_and_no_job_is_taken_for_gone(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(machine, "GONE_GRACE_S", 0.0)  # a missing job would be gone at once
    jobs = watched(tmp_path, "11", "12")
    running = {"11": ("RUNNING", "n1"), "12": ("RUNNING", "n2")}
    answers = [running, None, None, None, running, {"11": ("COMPLETED", "n1"), "12": ("COMPLETED", "n2")}]

    def on_poll(n):
        if n == 6:
            finish(jobs[0].job), finish(jobs[1].job)

    script(monkeypatch, answers, on_poll=on_poll)
    with caplog.at_level("INFO", logger="attnlab"):
        sl.watch(jobs, poll_s=0.0)
    assert [w.state for w in jobs] == ["COMPLETED", "COMPLETED"]
    assert "gone" not in caplog.text.lower()
    assert caplog.text.count("controller does not answer") == 1 and "answers again" in caplog.text


def test_a_completed_job_whose_result_shows_late_is_not_failed(monkeypatch, tmp_path):
    jobs = watched(tmp_path, "21")
    done = {"21": ("COMPLETED", "n1")}

    def on_poll(n):
        if n == 4:  # the result file shows three polls after the controller said COMPLETED
            finish(jobs[0].job)

    script(monkeypatch, [{"21": ("RUNNING", "n1")}, done], on_poll=on_poll)
    sl.watch(jobs, poll_s=0.0)
    assert jobs[0].state is SlurmState.COMPLETED and jobs[0].outcome == (True, "done")


@pytest.mark.parametrize("state", sorted(machine.MAYBE_REQUEUED))
def test_a_state_slurm_may_requeue_from_is_looked_at_again(state, monkeypatch, tmp_path, caplog):
    jobs = watched(tmp_path, "31")
    answers = [{"31": ("RUNNING", "n1")}, {"31": (state, "n1")}, {"31": (state, "n1")}, {"31": ("PENDING", "")},
               {"31": ("RUNNING", "n2")}, {"31": ("COMPLETED", "n2")}]
    script(monkeypatch, answers, on_poll=lambda n: n == 6 and finish(jobs[0].job))
    with caplog.at_level("INFO", logger="attnlab"):
        sl.watch(jobs, poll_s=0.0)
    assert jobs[0].state == "COMPLETED"
    assert f"{state.lower()} (slurm may requeue it)" in caplog.text and "requeued" in caplog.text


def test_a_state_that_stays_is_final_after_its_grace(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "REQUEUE_GRACE_S", 0.0)
    jobs = watched(tmp_path, "41")
    script(monkeypatch, [{"41": ("RUNNING", "n1")}, {"41": ("NODE_FAIL", "n1")}])
    sl.watch(jobs, poll_s=0.0)
    assert jobs[0].state == "NODE_FAIL"


def test_polling_backs_off_while_nothing_changes_and_one_query_serves_every_thread(monkeypatch, tmp_path):
    answers = [{"51": ("RUNNING", "n1"), "52": ("RUNNING", "n2")}] * 12
    jobs, at = watched(tmp_path, "51", "52"), []
    script(monkeypatch, answers + [{"51": ("COMPLETED", "n1"), "52": ("COMPLETED", "n2")}],
           on_poll=lambda n: at.append(sl.time.now) or n == 13 and (finish(jobs[0].job), finish(jobs[1].job)))
    sl.watch(jobs, poll_s=2.0, poll_max_s=30.0)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert gaps[:3] == [2.0, 3.0, 4.5] and gaps == sorted(gaps) and max(gaps) == 30.0, gaps
    assert max(sl.time.slept) == machine.RESULT_LOOK_S  # looking for the result files between polls

    # two watching threads (an Optuna sweep's parallel trials), one squeue for both jobs a poll
    queue = slurm_queue.SharedQueue()
    calls = []
    monkeypatch.setattr(slurm_queue, "queue_states", lambda ids: calls.append(ids) or {i: slurm_queue.Queued(SlurmState.RUNNING, "n1") for i in ids})
    queue.follow(["61"])
    queue.follow(["62"])
    threads = [threading.Thread(target=queue.states, args=(60.0,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [["61", "62"]]


def requeue_lines(monkeypatch, caplog, job, answers: list, on_poll) -> list[str]:
    """The driver's "requeued" lines for one job following the scripted squeue answers."""
    script(monkeypatch, answers, on_poll=on_poll)
    with caplog.at_level("INFO", logger="attnlab"):
        sl.watch([job], poll_s=0.0)
    return [r.getMessage() for r in caplog.records if ": requeued" in r.getMessage()]


def test_a_job_requeued_between_two_polls_is_said_requeued_once_with_the_cause_its_run_recorded(
        monkeypatch, tmp_path, caplog):
    """RUNNING, COMPLETING (its attempt ending: scontrol requeue after a lost node), RUNNING again: the poll never
    saw it pending. The driver says it was requeued, once, with the cause from the run's lineage (the next attempt
    has begun, the ended one under `earlier`)."""
    run_dir = tmp_path / "0"
    run_dir.mkdir()
    (run_dir / "lineage.json").write_text(json.dumps({**RUNNING.record(), "earlier": [
        {**LOST_REQUEUED.record(), "error": "Connection reset by peer", "global_step": 15}]}))
    (job,) = [sl.Watched(FakeJob("31", tmp_path), 0, ["seed=0"], set(), run_dir)]

    def on_poll(n):
        if n == 5:
            finish(job.job)

    said = requeue_lines(monkeypatch, caplog, job, [
        {"31": ("RUNNING", "n[1-2]")}, {"31": ("COMPLETING", "n[1-2]")}, {"31": ("RUNNING", "n[1-2]")},
        {"31": ("RUNNING", "n[1-2]")}, {"31": ("COMPLETED", "")}], on_poll)
    assert said == ["job 31 (#0: seed=0): requeued (a peer was lost: Connection reset by peer); it continues from step 15 "
                    "(last.ckpt) when it runs again"], caplog.text
    assert job.state == "COMPLETED"


def test_an_attempt_that_ended_without_a_word_is_not_given_the_cause_of_the_one_before(monkeypatch, tmp_path,
                                                                                      caplog):
    """Attempt 0 requeued for a lost peer; attempt 1 lost its batch node and ended unrecorded (its record still says
    running), SLURM requeuing the job itself: the second requeue is said without a cause, not with attempt 0's."""
    run_dir = tmp_path / "0"
    run_dir.mkdir()
    first = {**LOST_REQUEUED.record(), "error": "Connection reset by peer", "global_step": 15,
             "slurm": {"restart_count": 0}}
    (run_dir / "lineage.json").write_text(json.dumps(first))
    (job,) = [sl.Watched(FakeJob("32", tmp_path), 0, ["seed=0"], set(), run_dir)]

    def on_poll(n):
        if n == 3:  # attempt 1 trains
            (run_dir / "lineage.json").write_text(json.dumps(
                {**RUNNING.record(), "slurm": {"restart_count": 1}, "earlier": [first]}))
        if n == 6:
            finish(job.job)

    said = requeue_lines(monkeypatch, caplog, job, [
        {"32": ("RUNNING", "n[1-2]")}, {"32": ("PENDING", "")}, {"32": ("RUNNING", "n[1-2]")},
        {"32": ("PENDING", "")}, {"32": ("RUNNING", "n[1-2]")}, {"32": ("COMPLETED", "")}], on_poll)
    assert said == ["job 32 (#0: seed=0): requeued (a peer was lost: Connection reset by peer); it continues from step 15 "
                    "(last.ckpt) when it runs again", "job 32 (#0: seed=0): requeued"], caplog.text


def test_slurm_s_words_for_a_state_are_read_once_into_job_states(monkeypatch):
    """squeue's and sacct's answers become JobStates where they are read: sacct's `CANCELLED by 1000` is CANCELLED,
    a state this SLURM has and the table lacks is UNKNOWN (alive: not final), and when an attempt began is kept
    for a running job only."""
    import subprocess

    said = {"squeue": "7|RUNNING|n1|2026-01-01T00:00:00\n8|SOME_NEW_STATE|n2|2026-01-01T00:00:00\n9|PENDING||N/A\n",
            "sacct": "CANCELLED by 1000\n"}
    monkeypatch.setattr(slurm_queue, "ask", lambda *command: subprocess.CompletedProcess(command, 0, said[command[0]], ""))
    states = slurm_queue.queue_states(["7", "8", "9"])
    assert states == {"7": (SlurmState.RUNNING, "n1", "2026-01-01T00:00:00"), "8": (SlurmState.UNKNOWN, "n2", ""),
                      "9": (SlurmState.PENDING, "", "")}
    assert all(type(s.state) is SlurmState for s in states.values()) and SlurmState.UNKNOWN not in machine.FINAL
    assert slurm_queue.sacct_state("7") is SlurmState.CANCELLED
