"""The sweep driver's view of one SLURM job (the state machine of attnlab/cluster/sweep_states.py),
property-based. Hypothesis draws a job's life: attempts requeued after a time limit, a lost node, a preemption or
`scontrol requeue`, held or missing from the queue for a while, outages of the controller anywhere, accounting on
or off, sacct's answer once the controller has forgotten the job, and a result file that shows before the end,
late, or never. The driver's own `watch()` follows it on a fake clock (squeue, sacct and the clock are faked; the
result file is a real pickle in a temporary folder). What must hold:

- the verdict is COMPLETED when the last attempt completed and its result file showed within RESULT_GRACE_S;
  otherwise FAILED, SLURM's final state or GONE, said once, in one error line that is the job's last;
- no verdict before the last attempt has ended (or is COMPLETING, its result file whole), where SLURM's next
  attempt shows within the grace of the wait the driver is in (a life where it does not cannot be told from a job that ended; `fair` keeps to the first kind);
- the verdict comes within VERDICT_BOUND_S of fake time after the job's last event.

Each life hypothesis found the driver wrong on is kept as a plain test below the property."""

from __future__ import annotations

import logging
import pickle
import tempfile
from bisect import bisect_right
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hypothesis import HealthCheck, given, settings, strategies as st

from attnlab.cluster import slurm_queue, sweep_states as machine, sweep_watch as sl
from attnlab.cluster.outcome import SlurmState

OUTAGE, MISSING = "OUTAGE", "MISSING"  # squeue fails; squeue answers without the job
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD"}
LAST_ENDS = ["COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "PREEMPTED"]
T0 = 1000.0  # the fake clock when watch() starts
JOB_ID = "7"


@dataclass(frozen=True)
class Life:
    """One job as SLURM runs it: squeue's answer over time, `segments` of (state, seconds) one after the other from
    watch()'s start (OUTAGE: squeue fails; MISSING: squeue answers without the job); after the last the controller
    has forgotten the job. `sacct`: its state from then on (accounting on). `result`: the result file, "completed"
    or "failed" (Hydra's JobReturn), "error" (submitit's traceback) or None (never), whole `result_at` seconds after
    the last attempt's end (negative: before), cut short for the `cut` seconds before (being written).
    `requeue_off`: scontrol says Requeue=0 from the last attempt's end on (its budget of requeues spent)."""

    segments: tuple[tuple[str, int], ...]
    accounting: bool = False
    sacct: str | None = None
    result: str | None = None
    result_at: int = 0
    cut: int = 0
    requeue_off: bool = False  # the last attempt made non-requeueable (scontrol's Requeue=0 from its end on)

    @property
    def starts(self) -> list[int]:
        return list(accumulate([0] + [s for _, s in self.segments]))

    @property
    def final_end(self) -> float:
        """When the last attempt ended: the end of the last alive segment (SLURM runs the job no more after it)."""
        alive = [i for i, (state, s) in enumerate(self.segments) if state in ALIVE and s > 0]
        return T0 + (self.starts[alive[-1] + 1] if alive else 0)

    @property
    def over(self) -> float:
        """The earliest the job may be called over: the last attempt's end, or while it is COMPLETING once its
        result file is whole (the run is over, SLURM cleaning up)."""
        alive = [i for i, (state, s) in enumerate(self.segments) if state in ALIVE and s > 0]
        if alive and self.segments[alive[-1]][0] == "COMPLETING" and self.result_time is not None:
            return min(self.final_end, max(T0 + self.starts[alive[-1]], self.result_time))
        return self.final_end

    @property
    def end(self) -> str:
        return next(state for state, _ in reversed(self.segments) if state not in (OUTAGE, MISSING))

    @property
    def result_time(self) -> float | None:
        return None if self.result is None else self.final_end + self.result_at

    @property
    def last_event(self) -> float:
        """The last change: the controller forgetting the job (the end of the last segment), or the result file."""
        return max(T0 + self.starts[-1], self.result_time or T0)

    def at(self, t: float) -> str:
        """squeue's answer at fake time t: a state, OUTAGE or MISSING."""
        i = bisect_right(self.starts, t - T0) - 1
        return self.segments[i][0] if i < len(self.segments) else MISSING

    def began(self, t: float) -> str:
        """squeue's start time of the attempt running (or completing) at t: when its RUNNING segment started."""
        i = bisect_right(self.starts, t - T0) - 1
        return str(T0 + max(self.starts[j] for j in range(i + 1) if self.segments[j][0] == "RUNNING"))

    def sacct_at(self, t: float) -> str | None:
        """sacct's state at t: the state the job is in while the controller knows it, `sacct` once forgotten."""
        i = bisect_right(self.starts, t - T0) - 1
        if i >= len(self.segments):
            return self.sacct
        known = [state for state, _ in self.segments[:i + 1] if state not in (OUTAGE, MISSING)]
        return known[-1] if known else "PENDING"


def fair(segments: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The life shortened where the driver could not tell a next attempt from the job's end: between two things the
    driver surely sees reset its waits (an alive segment, or an outage, of POLL_MAX_S or more), the stretch up to the
    job's next alive segment lasts less than the grace of the wait it may put the driver in (GONE_GRACE_S where the
    job is missing, else REQUEUE_GRACE_S), its segments scaled down where it does not."""
    segments = list(segments)
    sure = [s >= machine.POLL_MAX_S and (state in ALIVE or state == OUTAGE) for state, s in segments]
    alive = [i for i, (state, s) in enumerate(segments) if state in ALIVE and s > 0]
    gaps: list[list[int]] = [[]]
    for i in range(len(segments)):
        if sure[i]:
            gaps.append([])
        else:
            gaps[-1].append(i)
    for gap in filter(None, gaps):
        if any(j > gap[-1] for j in alive):  # the job runs again after the stretch
            upto = gap
        else:  # the last stretch: up to the job's last alive segment in it
            upto = [i for i in gap if any(i < j for j in alive)]
        states = {segments[i][0] for i in upto}
        limit = machine.GONE_GRACE_S if MISSING in states else machine.REQUEUE_GRACE_S
        total = sum(segments[i][1] for i in upto)
        if states - ALIVE - {OUTAGE} and total >= limit:
            for i in upto:
                segments[i] = (segments[i][0], int(segments[i][1] * (limit - 1) // total))
    return segments


@st.composite
def lives(draw) -> Life:
    segments: list[tuple[str, int]] = []
    seconds = st.integers
    attempts = draw(seconds(1, 4))
    for i in range(attempts):
        if i:  # how the attempt before ended, and the requeue
            how = draw(st.sampled_from(["TIMEOUT", "NODE_FAIL", "PREEMPTED", "scontrol requeue"]))
            if how != "scontrol requeue":
                segments.append((how, draw(seconds(0, 220))))
            if draw(st.booleans()):
                segments.append((MISSING, draw(seconds(1, 60))))
            for held in draw(st.lists(st.sampled_from(["REQUEUED", "REQUEUE_HOLD"]), max_size=2, unique=True)):
                segments.append((held, draw(seconds(0, 40))))
        elif draw(st.booleans()):
            segments.append((MISSING, draw(seconds(1, 60))))  # not in squeue's answer yet
        segments.append(("PENDING", draw(seconds(0, 600))))
        if draw(st.booleans()):
            segments.append(("CONFIGURING", draw(seconds(0, 60))))
        segments.append(("RUNNING", draw(seconds(1, 2400))))  # an attempt runs, if shortly
        if draw(st.booleans()):
            segments.append(("COMPLETING", draw(seconds(0, 40))))
    end = draw(st.sampled_from(LAST_ENDS))
    segments.append((end, draw(seconds(0, 400))))  # squeue shows it ended until the controller forgets it
    for _ in range(draw(seconds(0, 3))):
        segments.insert(draw(seconds(0, len(segments))), (OUTAGE, draw(seconds(1, 900))))
    accounting = draw(st.booleans())
    sacct = draw(st.sampled_from([end, None, "RUNNING"])) if accounting else None
    result, result_at = None, 0
    if end in ("COMPLETED", "FAILED"):
        kinds = ["completed", "failed", None] if end == "COMPLETED" else ["failed", "error", None]
        result = draw(st.sampled_from(kinds))
        last_alive = [s for state, s in segments if state in ALIVE][-1]
        result_at = draw(seconds(-min(20, last_alive), int(machine.RESULT_GRACE_S) - 1))
    cut = draw(st.one_of(st.just(0), seconds(1, 60))) if result else 0
    requeue_off = end in machine.MAYBE_REQUEUED and draw(st.booleans())
    return Life(tuple(fair(segments)), accounting, sacct, result, result_at, cut, requeue_off)


class Clock:
    """The driver's `time`: monotonic() the fake time, sleep() moves it (and shows the result file when due)."""

    def __init__(self, world: "World"):
        self.now, self.world = T0, world

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.world.tick()


class NoVerdict(AssertionError):
    pass


class World:
    """The job's life served to the driver: squeue, sacct, the clock, the result file."""

    def __init__(self, life: Life, folder: Path):
        self.life, self.clock = life, Clock(self)
        self.job = SimpleNamespace(job_id=JOB_ID, num_tasks=1, paths=SimpleNamespace(
            stdout=folder / f"{JOB_ID}_0_log.out", result_pickle=folder / f"{JOB_ID}_0_result.pkl"))
        self.job.task = lambda i: self.job
        self.job.paths.stdout.with_suffix(".err").write_text(f"slurmstepd: error: *** JOB {JOB_ID} ON n1 ENDED ***\n")
        self.written = ""
        self.give_up = life.last_event + bound() + 4 * machine.POLL_MAX_S
        self.tick()

    def tick(self) -> None:
        life, now = self.life, self.clock.now
        if now > self.give_up:
            raise NoVerdict(f"no verdict at {now - T0:.0f} s, the last event at {life.last_event - T0:.0f} s")
        if life.result_time is not None and now >= life.result_time - life.cut and self.written != "whole":
            ret = JobReturn()
            ret.overrides, ret.status = ["seed=0"], JobStatus.COMPLETED
            ret._return_value = 0.25
            if life.result == "failed":  # the run raised: Hydra's JobReturn says so, the job ends COMPLETED or not
                ret.status, ret._return_value = JobStatus.FAILED, ValueError("loss is nan")
            outcome = ("error", "Traceback (most recent call last): ...") if life.result == "error" else ("success", ret)
            whole = pickle.dumps(outcome)
            self.written = "whole" if now >= life.result_time else "cut"
            self.job.paths.result_pickle.write_bytes(whole if self.written == "whole" else whole[:len(whole) // 2])

    def squeue(self, ids: list[str]) -> dict[str, tuple[str, str]] | None:
        self.tick()
        state = self.life.at(self.clock.now)
        if state == OUTAGE:
            return None
        if state == MISSING or JOB_ID not in ids:
            return {}
        running = state in ("RUNNING", "COMPLETING")
        return {JOB_ID: machine.Queued(SlurmState(state), "n1" if running else "",
                                       self.life.began(self.clock.now) if running else "")}

    def sacct(self, job_id: str) -> SlurmState | None:
        said = self.life.sacct_at(self.clock.now) if job_id == JOB_ID else None
        return SlurmState(said) if said else None

    def requeueable(self, job_id: str) -> bool | None:
        """scontrol's Requeue flag: None while the controller does not know the job or does not answer."""
        now = self.clock.now
        if job_id != JOB_ID or self.life.at(now) in (OUTAGE, MISSING):
            return None
        return not (self.life.requeue_off and now >= self.life.final_end)


def bound() -> float:
    return 2 * machine.POLL_MAX_S + max(machine.GONE_GRACE_S, machine.RESULT_GRACE_S, machine.REQUEUE_GRACE_S)


@contextmanager
def lines():
    """The driver's log records (logger "attnlab", INFO and up)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("attnlab")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def follow(life: Life) -> tuple[sl.Watched, float, list[logging.LogRecord]]:
    """watch() of the driver on the life: the job as it ended, the fake time of the verdict, the job's lines."""
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        world = World(life, Path(folder))
        for module, name, fake in [(slurm_queue, "queue_states", world.squeue), (slurm_queue, "sacct_state", world.sacct),
                                   (slurm_queue, "requeueable", world.requeueable),
                                   (slurm_queue, "accounting_on", lambda: life.accounting), (sl, "time", world.clock),
                                   (machine, "time", world.clock), (slurm_queue, "time", world.clock),
                                   (slurm_queue, "QUEUE", slurm_queue.SharedQueue())]:
            stack.enter_context(mock.patch.object(module, name, fake))
        records = stack.enter_context(lines())
        w = sl.Watched(world.job, 0, ["seed=0"], set())
        sl.watch([w])
        return w, world.clock.now, [r for r in records if r.getMessage().startswith(f"job {JOB_ID} (")]


def expected(life: Life) -> set[str]:
    """The verdicts right for the life. Where the driver may not have seen how the job ended (squeue showed the end
    for less than a poll's interval, sacct does not say it, no result file yet), GONE too, and an end shown before
    the last attempt if no poll need have seen that attempt alive."""
    end, shown = life.end, False
    for state, s in reversed(life.segments):  # the segments after the last alive one
        if state in ALIVE and s > 0:
            break
        shown |= state == end and s >= machine.POLL_MAX_S
    sure = shown or (life.accounting and life.sacct == end) or (life.result is not None and life.result_at <= 0)
    if end == "COMPLETED":
        right = {"COMPLETED" if life.result == "completed" else "FAILED"} if life.result else {"GONE"}
    elif end == "FAILED" or life.result:
        right = {"FAILED"}
    else:
        right = {end}
    seen = [i for i, (state, s) in enumerate(life.segments) if state in ALIVE and s >= machine.POLL_MAX_S]
    earlier = {state for state, _ in life.segments[seen[-1] + 1 if seen else 0:] if state in machine.MAYBE_REQUEUED}
    return right if sure else right | {"GONE"} | earlier


def check(life: Life) -> None:
    w, verdict_at, said = follow(life)
    assert w.state in machine.FINAL
    assert w.state in expected(life), (w.state, expected(life))
    assert verdict_at >= life.over, f"verdict {w.state} at {verdict_at - T0:.0f} s, the job ran until " \
                                    f"{life.final_end - T0:.0f} s"
    assert verdict_at <= life.last_event + bound(), (verdict_at - T0, life.last_event - T0)
    final = [r for r in said if r.levelno >= logging.ERROR]
    if w.state == "COMPLETED":
        assert not final and said[-1].getMessage().split(": ", 2)[-1].startswith("completed")
        assert w.outcome.ok and w.outcome.value.status == JobStatus.COMPLETED
    else:
        assert final == [said[-1]], [r.getMessage() for r in said]
        assert f": {w.state.lower()}" in final[0].getMessage() and "*** JOB 7 ON n1 ENDED ***" in final[0].getMessage()
    attempts = sum(state == "RUNNING" for state, _ in life.segments)
    requeued = [r for r in said if r.getMessage().split(": ", 2)[-1].startswith("requeued")]
    assert len(requeued) <= attempts - 1, [r.getMessage() for r in said]
    # each attempt that ran for a poll's longest interval was seen running: each requeue between two such was said
    seen = sum(state == "RUNNING" and s >= machine.POLL_MAX_S for state, s in life.segments)
    assert len(requeued) >= seen - 1, [r.getMessage() for r in said]


@settings(deadline=None, max_examples=400, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(lives())
def test_the_driver_s_verdict_on_any_life_of_a_job(life):
    check(life)


def test_the_state_machine_s_time_bound_is_the_driver_s():
    assert machine.VERDICT_BOUND_S == bound() == 240.0


# The lives hypothesis found the driver wrong on (and a few written by hand: "by hand"), each with what it shows.
FOUND = {
    # TIMEOUT's requeue wait was kept through the attempts after: a later end, long after, was final at once
    "a node failure after a requeued time limit waits for its own requeue (by hand)": Life(
        (("RUNNING", 100), ("TIMEOUT", 40), ("PENDING", 20), ("RUNNING", 300), ("NODE_FAIL", 60), ("PENDING", 20),
         ("RUNNING", 100), ("COMPLETED", 60)), result="completed", result_at=5),
    "a second time limit waits for its own requeue": Life(
        (("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 1), ("PENDING", 127), ("RUNNING", 30), ("TIMEOUT", 26),
         ("PENDING", 0), ("RUNNING", 1), ("CANCELLED", 0))),
    "a second time limit waits for its own requeue, then the job is gone": Life(
        (("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 1), ("PENDING", 127), ("RUNNING", 30), ("TIMEOUT", 26),
         ("PENDING", 30), ("RUNNING", 0), ("CANCELLED", 0))),
    "a completed attempt after a requeue waits for its late result (by hand)": Life(
        (("RUNNING", 100), ("TIMEOUT", 40), ("PENDING", 20), ("RUNNING", 300), ("COMPLETED", 300)),
        result="completed", result_at=60),
    # one timer for two waits: a COMPLETED seen after a TIMEOUT (its attempt in between too short to be seen)
    # found the requeue wait's time already past the result's grace
    "the result wait is not the requeue wait's": Life(
        (("PENDING", 0), ("RUNNING", 1), ("TIMEOUT", 0), ("PENDING", 0), ("RUNNING", 1), ("TIMEOUT", 123),
         ("PENDING", 0), ("RUNNING", 1), ("TIMEOUT", 0), ("PENDING", 0), ("RUNNING", 6), ("COMPLETED", 0)),
        accounting=True, sacct="COMPLETED", result="completed", result_at=23),
    # the controller forgetting the job (accounting off) dropped how it ended: GONE after 30 s
    "a time limit the controller forgets is a time limit": Life(
        (("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 0), ("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 30))),
    "a completed job the controller forgets still waits for its result (by hand)": Life(
        (("RUNNING", 100), ("COMPLETED", 30)), result="completed", result_at=119),
    # the waits went on through an outage: the job, requeued while the controller was down, was final or gone
    "an outage does not use up the requeue wait": Life(
        (("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 1), ("OUTAGE", 181), ("MISSING", 1), ("PENDING", 0),
         ("RUNNING", 1), ("CANCELLED", 0))),
    "an outage does not use up the requeue wait (by hand)": Life(
        (("RUNNING", 100), ("TIMEOUT", 100), ("OUTAGE", 200), ("TIMEOUT", 50), ("PENDING", 50), ("RUNNING", 100),
         ("COMPLETED", 60)), result="completed"),
    "an outage does not use up the missing job's grace (by hand)": Life(
        (("MISSING", 20), ("OUTAGE", 60), ("MISSING", 20), ("PENDING", 40), ("RUNNING", 100), ("COMPLETED", 60)),
        result="completed"),
    # squeue's REQUEUED over two polls was said "requeued" at each
    "a requeue is said once": Life(
        (("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 0), ("REQUEUED", 3), ("PENDING", 0), ("RUNNING", 0),
         ("COMPLETED", 0)), result="completed"),
    # a result file cut short (being written) stopped the driver with pickle's UnpicklingError
    "a result file being written is waited for (by hand)": Life(
        (("RUNNING", 100), ("COMPLETED", 60)), result="completed", result_at=30, cut=20),
    # a node lost on the test cluster: NODE_FAIL, requeued and running again within the 30 s between two polls; the
    # driver saw RUNNING twice and said nothing of the requeue
    "a requeue between two polls is said (by hand)": Life(
        (("PENDING", 2), ("RUNNING", 100), ("NODE_FAIL", 1), ("PENDING", 2), ("RUNNING", 100), ("COMPLETED", 60)),
        result="completed"),
    # the test's own: an end shown before an attempt no poll saw may be the verdict
    "an attempt no poll saw": Life(
        (("PENDING", 0), ("RUNNING", 0), ("TIMEOUT", 1), ("PENDING", 0), ("RUNNING", 0), ("CANCELLED", 0))),
}


@pytest.mark.parametrize("life", FOUND.values(), ids=FOUND.keys())
def test_a_life_the_driver_was_wrong_on(life):
    check(life)


@pytest.mark.parametrize("end", sorted(machine.MAYBE_REQUEUED))
def test_a_job_slurm_will_not_requeue_gets_its_verdict_without_the_requeue_wait(end):
    """Its budget of requeues spent, the job was made non-requeueable (Requeue=0): its end is final at the first poll
    that sees it, not after REQUEUE_GRACE_S; the same end of a requeueable job waits the grace."""
    life = Life((("PENDING", 5), ("RUNNING", 100), (end, 400)), requeue_off=True)
    w, verdict_at, _ = follow(life)
    assert w.state == end and verdict_at - life.final_end <= machine.POLL_MAX_S, verdict_at - life.final_end
    w, verdict_at, _ = follow(Life(life.segments))
    assert w.state == end and verdict_at - life.final_end >= machine.REQUEUE_GRACE_S, verdict_at - life.final_end


def test_a_run_s_end_is_said_within_seconds_of_its_result_file():
    """A long attempt (the polls POLL_MAX_S apart by its end) writes its result as it ends: the driver, looking for
    the file between polls, says COMPLETED within seconds of it, not up to POLL_MAX_S later."""
    life = Life((("PENDING", 5), ("RUNNING", 600), ("COMPLETING", 2), ("COMPLETED", 300)), result="completed",
                result_at=-2)
    w, verdict_at, said = follow(life)
    assert w.state == "COMPLETED" and verdict_at - life.result_time <= 2 * machine.RESULT_LOOK_S + machine.POLL_S, \
        (verdict_at - life.result_time, [r.getMessage() for r in said])



def test_a_job_completing_with_its_result_written_is_over():
    """SLURM keeps the job COMPLETING for a minute (its epilog's message lost in an outage of the controller) after
    the run wrote its result: the driver says it completed within seconds of the result, not after the minute."""
    life = Life((("PENDING", 5), ("RUNNING", 100), ("COMPLETING", 65), ("COMPLETED", 60)), result="completed",
                result_at=-64)
    w, verdict_at, _ = follow(life)
    assert w.state == "COMPLETED" and verdict_at - life.result_time <= machine.POLL_S + 2 * machine.RESULT_LOOK_S, \
        verdict_at - life.result_time
