"""The rules of a job's life (attnlab.cluster.rules.decide), without a cluster: a table of the cases a user meets,
and the properties that hold for any event in any state."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.cluster.outcome import COUNTED, AttemptEnd, Cause, Outcome
from attnlab.cluster.rules import (LOST_MARKS, WARNING_SLACK_S, Decision, Event, JobState, decide,
                                   lost_peer, warning_cause)
from attnlab.cluster.exit import STOPPED

SLURM = JobState(in_slurm=True, budget=2)

# (event, state) -> (status, save, requeue, exit code, at once)
TABLE = [
    (Event.FINISHED, JobState(), ("finished", False, False, 0, False)),
    (Event.STARTED, SLURM, ("running", False, False, None, False)),
    (Event.STARTED, JobState(in_slurm=True, budget=2, spent=3), ("failed: a peer was lost, not requeued", False,
                                                                 False, 1, True)),
    (Event.SIGTERM, JobState(step_s=1.0), ("stopped", True, False, 143, False)),
    (Event.SIGTERM, JobState(step_s=45.0), ("stopped at once: SIGTERM while a step has run for 45 s", False, False,
                                            143, True)),
    (Event.SIGTERM_AGAIN, JobState(), ("stopped at once: a second SIGTERM", False, False, 143, True)),
    # the time limit's SIGTERM (srun's and the step's) after its warning: the warning's save goes on
    (Event.SIGTERM, JobState(step_s=1.0, warned=True), ("running", False, False, None, False)),
    (Event.SIGTERM_AGAIN, JobState(step_s=1.0, warned=True), ("running", False, False, None, False)),
    (Event.SIGTERM, JobState(step_s=45.0, warned=True), ("stopped at once: SIGTERM while a step has run for 45 s",
                                                         False, False, 143, True)),
    (Event.WARNING, JobState(in_slurm=True, budget=2, cause=Cause.TIME_LIMIT, spent=1),
     ("requeued: time limit", True, True, 143, False)),
    (Event.WARNING, JobState(in_slurm=True, budget=2, cause=Cause.TIME_LIMIT, spent=2),
     ("stopped: time limit, not requeued", True, False, 143, False)),
    (Event.WARNING, JobState(in_slurm=True, budget=2, cause=Cause.PREEMPTED, spent=9),  # preemptions are not counted
     ("requeued: preempted", True, True, 143, False)),
    (Event.WARNING, JobState(in_slurm=True, cause=Cause.SLURM_WARNING), ("requeued: SLURM's warning", True, True, 143,
                                                                         False)),
    (Event.REQUEUE_REFUSED, JobState(in_slurm=True, cause=Cause.PREEMPTED),
     ("stopped: preempted, not requeued", False, False, 143, False)),
    (Event.PEER_FAILED, JobState(in_slurm=True, detail="rank 1"), ("failed: rank 1 failed", False, False, 1, False)),
    (Event.PEER_LOST, JobState(in_slurm=True, budget=2, spent=1), ("requeued: a peer was lost", False, True, 143,
                                                                   True)),
    (Event.PEER_LOST, JobState(in_slurm=True, budget=2, spent=2), ("failed: a peer was lost, not requeued", False,
                                                                   False, 1, True)),
    (Event.PEER_LOST, JobState(), ("failed: a peer was lost, not requeued", False, False, 1, False)),
]


@pytest.mark.parametrize("event, state, expected", TABLE, ids=[f"{e.name}-{i}" for i, (e, _, _) in enumerate(TABLE)])
def test_what_happens_in_each_case(event, state, expected):
    d = decide(event, state)
    assert (d.end.status, d.save, d.requeue, d.exit_code, d.at_once) == expected


def test_the_stopped_status_is_the_one_the_process_exits_with():
    assert STOPPED == 143 and {decide(Event.SIGTERM, JobState()).exit_code} == {STOPPED}


states = st.builds(JobState, in_slurm=st.booleans(), cause=st.none() | st.sampled_from(list(Cause)),
                   spent=st.integers(0, 6), budget=st.integers(0, 4), step_s=st.floats(0, 120),
                   patience_s=st.floats(1, 60), detail=st.text(max_size=20), warned=st.booleans())


@given(event=st.sampled_from(list(Event)), state=states)
def test_any_event_in_any_state(event, state):
    d = decide(event, state)
    assert isinstance(d, Decision)
    # the exit status says how the attempt ended, as a scheduler reads it
    expected_code = {Outcome.FINISHED: 0, Outcome.REQUEUED: 143, Outcome.STOPPED: 143, Outcome.FAILED: 1,
                     Outcome.RUNNING: None}[d.end.outcome]
    assert d.exit_code == expected_code
    assert d.requeue == (d.end.outcome is Outcome.REQUEUED)
    # a counted cause is never requeued past its budget; nothing is requeued where no scheduler can continue it
    if d.requeue:
        assert not d.forbid_requeue
        assert d.end.cause not in COUNTED or state.spent < state.budget
        assert state.in_slurm or event is Event.WARNING
    # a preemption (or a warning of one's own script) is always requeued: it is not the run's fault
    if event is Event.WARNING and state.cause in (Cause.PREEMPTED, Cause.SLURM_WARNING, None):
        assert d.requeue and d.save
    # a stop at once saves nothing (the step may never end); a bug in a rank never requeues
    assert not (d.at_once and d.save)
    if event is Event.PEER_FAILED:
        assert d.end.outcome is Outcome.FAILED and not d.requeue
    # after SLURM's warning, a SIGTERM stops only a step that has outrun the patience (the warning's save is under way)
    if event in (Event.SIGTERM, Event.SIGTERM_AGAIN) and state.warned:
        assert (d.exit_code is None) == (state.step_s < state.patience_s)
    # what the run writes is what the sweep driver reads back
    assert AttemptEnd.of(d.end.record()) == d.end and d.end.status


# (preempting, under submitit, seconds left, lead, submitit's judgement) -> why SLURM warned
CAUSES = [
    ((True, True, 30.0, 120.0, True), Cause.PREEMPTED),  # SLURM is preempting it: whatever the clock says
    ((False, False, 30.0, 120.0, True), Cause.SLURM_WARNING),  # a batch script of one's own
    ((False, True, 100.0, 120.0, False), Cause.TIME_LIMIT),  # within the lead of its end
    ((False, True, 120.0 + WARNING_SLACK_S, 120.0, False), Cause.TIME_LIMIT),  # SLURM's early signal, within slack
    ((False, True, 3600.0, 120.0, True), Cause.PREEMPTED),  # an hour before its end: a preemption
    ((False, True, None, 120.0, True), Cause.TIME_LIMIT),  # no end time known: submitit's judgement
    ((False, True, 100.0, None, False), Cause.PREEMPTED),  # no lead known: submitit's judgement
]


@pytest.mark.parametrize("given_, expected", CAUSES)
def test_why_slurm_warned(given_, expected):
    preempting, under_submitit, left, lead, timed_out = given_
    assert warning_cause(preempting, under_submitit, left, lead, lambda: timed_out) is expected


@given(preempting=st.booleans(), under_submitit=st.booleans(), left=st.none() | st.floats(-600, 7200),
       lead=st.none() | st.floats(0, 600), timed_out=st.booleans())
def test_why_slurm_warned_for_any_clock(preempting, under_submitit, left, lead, timed_out):
    asked = []
    cause = warning_cause(preempting, under_submitit, left, lead, lambda: asked.append(1) or timed_out)
    if preempting:
        assert cause is Cause.PREEMPTED
    elif not under_submitit:
        assert cause is Cause.SLURM_WARNING
    elif left is not None and lead is not None:  # the job's own end time decides, submitit is not asked
        assert (cause is Cause.TIME_LIMIT) == (left <= lead + WARNING_SLACK_S) and not asked
    else:
        assert cause is (Cause.TIME_LIMIT if timed_out else Cause.PREEMPTED) and asked == [1]
    assert asked in ([], [1])


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as e:
        return e


def _lost_errors():
    import torch.distributed as dist

    return [
        (dist.DistNetworkError("Connection reset by peer"), True),  # torch's own types of a broken collective
        (dist.DistBackendError("NCCL communicator was aborted on rank 0"), True),
        (dist.DistStoreError("Socket Timeout"), True),
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                      "[10.0.0.2]:29500"), True),
        (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network "
                      "error, NCCL version 2.21.5: nccl error"), True),
        # the error a run raises from the broken collective
        (_raised_from(RuntimeError("loss is nan"), RuntimeError("[gloo] Broken pipe")), True),
        # a rank's own error: its peers are told it failed, not that it was lost
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (ValueError("gloo: connection reset by peer"), False),  # not the backend's error type
        (RuntimeError("the connection to the W&B server timed out"), False),  # no backend named
        (RuntimeError("[gloo] mismatched tensor shapes in allreduce"), False),  # the backend, but no peer gone
    ]


def test_a_lost_peer_is_told_from_a_rank_s_own_error():
    for error, lost in _lost_errors():
        assert lost_peer(error) is lost, error


@given(before=st.text(max_size=30), after=st.text(max_size=30), backend=st.sampled_from(["gloo", "NCCL", "c10d"]),
       mark=st.sampled_from(LOST_MARKS), upper=st.booleans())
def test_a_backend_naming_a_peer_gone_is_a_lost_peer_in_any_words_around(before, after, backend, mark, upper):
    text = f"{before}[{backend}] {mark.upper() if upper else mark}{after}"
    assert lost_peer(RuntimeError(text))
    assert lost_peer(_raised_from(KeyError("step"), RuntimeError(text)))
    assert not lost_peer(ValueError(text))  # only the backends' RuntimeError (or their own types) say it

