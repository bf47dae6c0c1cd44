"""`launcher=slurm`: Hydra's submitit launcher, with a sweep driver that follows its jobs through the controller.

Hydra's launcher waits on each job's `results()`, which asks `sacct` at every poll: without accounting it never
learns that a cancelled job is gone, and with it a cancelled job ends the whole sweep with a traceback. This driver
polls `squeue` once for all the jobs it follows (backing off from 2 s to 30 s while nothing changes; a result file
showing brings the next poll forward), says one line per change of state, gathers the other jobs when one fails
(a grid's driver then exits 1 with one paragraph naming them), and takes nothing the controller cannot say for an
answer (the state machine of `_states.py`). Ctrl-C or SIGTERM of the driver cancels its jobs, each saving its
`last.ckpt`, so that the same command continues the sweep.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from attnlab.cluster.outcome import AttemptEnd, Outcome
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra_plugins.attnlab_slurm_launcher import _states
from hydra_plugins.attnlab_slurm_launcher._queries import _accounting_on, _queue_states
from hydra_plugins.attnlab_slurm_launcher._states import (FINAL, POLL_MAX_S, POLL_S,
                                                          RESULT_LOOK_S, RESULT_LOOKS_PER_S)
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as HydraSlurmLauncher

log = logging.getLogger("attnlab")
TAIL_LINES = 5


class SweepJobError(CompactHydraException):
    """Jobs of a sweep that did not complete: Hydra prints its message alone (no traceback) and exits with 1."""


class Watched:
    """One submitted job as the driver follows it. (A plain class: Hydra's plugin scan loads this module outside
    sys.modules, where dataclasses cannot resolve annotations.)"""

    def __init__(self, job: Any, num: int, overrides: list[str], common: set[str], run_dir: Path | None = None):
        self.job, self.num, self.overrides = job, num, overrides  # a submitit.SlurmJob, its number, its overrides
        self.run_dir = run_dir  # where its run writes (the sweep folder's <num>), for how an attempt ended
        self.label = " ".join(o for o in overrides  # what this job of the sweep sets (not the sweeper's own keys)
                              if o.lower() not in common and not o.lstrip("+").startswith("hydra."))
        self.state, self.nodes = "SUBMITTED", ""
        self.started = False  # an attempt was seen running (or ending) since the job last went back to the queue
        self.began = ""  # when the attempt seen running started (squeue's %S; "" when not known)
        self.requeued = False  # "requeued" said, and no attempt seen running since
        self.requeues = 0  # how many times "requeued" was said
        # _states.py's: the end the controller last gave for this attempt, the one wait it is in
        # ("requeue", "result", "gone"; None: none) and since when
        self.ended_as: str | None = None
        self.waiting: str | None = None
        self.since = 0.0
        self.outcome: tuple[str, Any] | None = None  # ("success", JobReturn) or ("error", traceback text)
        self.woke = False  # its result file showed between two polls and brought the next one forward

    @property
    def id(self) -> str:
        return str(self.job.job_id)

    def log_file(self) -> Path:
        return self.job.task(0).paths.stdout if self.job.num_tasks > 1 else self.job.paths.stdout

    def result_file(self) -> Path:
        return self.job.task(0).paths.result_pickle if self.job.num_tasks > 1 else self.job.paths.result_pickle


class SlurmLauncher(HydraSlurmLauncher):
    """Hydra's submitit SLURM launcher, its jobs followed through the controller (module docstring)."""

    def setup(self, **kwargs: Any) -> None:
        super().setup(**kwargs)
        self._active: dict[str, Watched] = {}
        if threading.current_thread() is threading.main_thread():  # Optuna's parallel trials launch from threads
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, self._cancel_then(signal.getsignal(signum)))

    def _cancel_then(self, previous: Any) -> Any:
        def handler(signum: int, frame: Any) -> None:
            ids = [job_id for job_id, w in list(self._active.items()) if w.state not in FINAL]
            if ids:
                log.warning(f"sweep stopped ({signal.Signals(signum).name}): cancelling its SLURM jobs "
                            f"{', '.join(ids)} (each saves its last.ckpt); the same command continues it")
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            if callable(previous):
                previous(signum, frame)
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                raise SystemExit(128 + signum)

        return handler

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        jobs = self._submit(job_overrides, initial_job_idx)
        common = {o.lower() for o in self.config.hydra.overrides.task}
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        watched = [Watched(job, initial_job_idx + i, list(overrides), common, sweep_dir / str(initial_job_idx + i))
                   for i, (job, overrides) in enumerate(zip(jobs, job_overrides))]
        self._active.update({w.id: w for w in watched})
        try:
            watch(watched)
        finally:
            for w in watched:
                self._active.pop(w.id, None)
        failed = [w for w in watched if w.state != "COMPLETED" or not w.outcome or w.outcome[0] != "success"]
        summary = _summary(failed, len(watched), sweep_dir)
        if failed and str(self.config.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper"):
            # a grid: Hydra's basic sweeper would stop at the first failed job with a traceback; the paragraph alone
            print(summary, file=sys.stderr, flush=True)
            raise SystemExit(1)
        return [returned(w, summary) for w in watched]  # a study's sweeper records each failed trial and goes on

    def _submit(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """Hydra's submission (its `launch` up to the wait): the executor, its parameters, one array of jobs."""
        import submitit
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf

        assert self.config is not None
        params = dict(self.params)
        # the job's tasks get the batch script's environment, where submitit names itself: a site whose sbatch
        # exports nothing (--export=NONE, SBATCH_EXPORT=NONE) has srun export nothing too
        srun_args = list(params.get("srun_args") or [])
        if not any(str(a).startswith("--export") for a in srun_args):
            params["srun_args"] = [*srun_args, "--export=ALL"]
        init_keys = {"max_num_timeout", "submitit_folder"}
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=params["submitit_folder"],
                                         slurm_max_num_timeout=params.get("max_num_timeout", 0))
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in params.items()
                                      if k not in init_keys})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"SLURM sweep of {len(job_overrides)} job(s), output in {sweep_dir}")
        args = []
        # each job is told its sweep folder, resolved here: a site whose sbatch exports no environment
        # (--export=NONE, SBATCH_EXPORT=NONE) would otherwise leave the jobs to claim folders of their own
        folder = f"hydra.sweep.dir='{sweep_dir}'"
        for i, overrides in enumerate(job_overrides):
            log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(overrides))}")
            args.append(([*overrides, folder], "hydra.sweep.dir", initial_job_idx + i,
                         f"job_id_for_{initial_job_idx + i}", Singleton.get_state()))
        try:
            return executor.map_array(self, *zip(*args))
        except Exception as e:  # sbatch's refusal (or no sbatch) as one paragraph, exit status 2 (cli/slurm/sbatch.py)
            from attnlab.cli.slurm.sbatch import explain_submission
            from attnlab.errors import fail

            err = explain_submission(e, {"launcher.partition": params.get("partition")})
            if err is None:
                raise
            fail(err)


def watch(watched: list[Watched], poll_s: float = POLL_S, poll_max_s: float = POLL_MAX_S) -> None:
    """Follow the jobs until each has ended (or is gone), one line per change of state."""
    accounting, interval, unreachable, woke = _accounting_on(), poll_s, False, False
    ids = [w.id for w in watched]
    for w in watched:  # as sbatch leaves it: in the queue, whether or not it starts before the first poll
        if w.state == "SUBMITTED":
            w.state = "PENDING"
            _report(w)
    QUEUE.follow(ids)
    try:
        while any(w.state not in FINAL for w in watched):
            queue = QUEUE.states(0.0 if woke else interval)
            changed = False
            if queue is None:  # the controller did not answer: nothing is known, so nothing is taken as gone
                if not unreachable:
                    log.warning("SLURM's controller does not answer (squeue failed); the jobs go on running on "
                                "their nodes: waiting for it")
                unreachable = True
            else:
                if unreachable:
                    log.info("SLURM's controller answers again")
                    for w in watched:  # SLURM requeued nothing, the driver saw nothing, meanwhile: the waits start anew
                        w.waiting = None
                unreachable = False
                changed = any([_states.follow(w, queue, accounting, _report) for w in watched if w.state not in FINAL])
            if any(w.state not in FINAL for w in watched):
                interval = poll_s if changed or woke else min(poll_max_s, interval * 1.5)
                woke = _nap(watched, interval)
    finally:
        QUEUE.forget(ids)


def _nap(watched: list[Watched], seconds: float) -> bool:
    """Sleep until the next poll, or until the result file of a job not ended yet shows (its verdict comes at the
    next poll instead of up to POLL_MAX_S later); each job's file wakes the driver once. -> whether one woke it."""
    looked = [w for w in watched if w.state not in FINAL and not w.woke]
    step = max(RESULT_LOOK_S, len(looked) / RESULT_LOOKS_PER_S)  # a large sweep looks less often
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(step, left))
        for w in looked:
            if w.result_file().exists():
                w.woke = True
                return True
    return False


def _report(w: Watched) -> None:
    where = f" on {w.nodes}" if w.state == "RUNNING" and w.nodes else ""
    line = f"job {w.id} ({_name(w)}): {w.state.lower()}{where}"
    if w.state in ("RUNNING", "COMPLETED"):
        log.info(f"{line}; log {w.log_file()}")
    elif w.state == "REQUEUED":
        log.warning(line + _requeued_because(w))
        w.requeues += 1
    elif w.state in FINAL:
        log.error(f"{line}; log {w.log_file()}{_tail(w)}")
    else:
        log.info(line)


def _requeued_because(w: Watched) -> str:
    """Why the job's last attempt ended, as its run recorded it (lineage.json: a lost peer, a preemption, a time
    limit), and where it goes on from."""
    try:
        record = json.loads((w.run_dir / "lineage.json").read_text())
    except (OSError, ValueError, TypeError):
        return ""
    # the attempt that ended: the one SLURM numbered by the requeues said before this one (an attempt that ended
    # without a word, its node lost, is not taken for the one before it); else the last that ended
    attempts = [*record.get("earlier", []), record]
    ended = [a for a in attempts if (a.get("slurm") or {}).get("restart_count") == w.requeues]
    if ended:
        record = ended[-1]
    elif getattr(AttemptEnd.of(record), "outcome", None) is not Outcome.REQUEUED and record.get("earlier"):
        record = record["earlier"][-1]  # the next attempt has begun already
    end = AttemptEnd.of(record)
    if end is None or end.outcome is not Outcome.REQUEUED:
        return ""
    detail = f": {record['error']}" if record.get("error") else ""
    return (f" ({end.cause.value if end.cause else 'requeued'}{detail}); it continues from step "
            f"{record.get('global_step', '?')} (last.ckpt) when it runs again")


def _name(w: Watched) -> str:
    return f"#{w.num}: {w.label}" if w.label else f"#{w.num}"


def _tail(w: Watched) -> str:
    """What the job's error log says of how it ended: attnlab's own lines (a failed rank, a stop) and its last line,
    else its last lines (a traceback, or the reason SLURM gave)."""
    lines: list[str] = []
    for path in (w.log_file().with_suffix(".err"), w.log_file()):
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        said = [ln for ln in lines if ln.startswith("attnlab: ")][-2:]
        lines = list(dict.fromkeys(said + lines[-1:])) if said else lines[-TAIL_LINES:]
        if lines:
            break
    return ("\n    " + "\n    ".join(lines)) if lines else ""


def _summary(failed: list[Watched], total: int, sweep_dir: Path) -> str:
    if not failed:
        return ""
    jobs = "; ".join(f"job {w.id} ({_name(w)}) {w.state.lower()}, log {w.log_file()}"
                     for w in failed)
    return (f"attnlab: error: {len(failed)} of {total} SLURM jobs of this sweep did not complete: {jobs}. The others' "
            f"results are in {sweep_dir / 'results.csv'}; run the same command again for an Optuna sweep to rerun "
            "the stopped trials, or rerun a job alone with `python train.py --rerun <its folder>`.")


def returned(w: Watched, summary: str) -> JobReturn:
    """What Hydra's sweepers expect of a job: its JobReturn, or a failed one whose return value raises."""
    if w.state == "COMPLETED" and w.outcome is not None and w.outcome[0] == "success":
        return w.outcome[1]
    ret = JobReturn()
    ret.status = JobStatus.FAILED
    ret.overrides = w.overrides
    ret._return_value = SweepJobError(summary)
    return ret


class _Queue:
    """squeue for every job the driver follows, one query a poll however many threads watch (an Optuna sweep's
    parallel trials each launch from a thread of their own)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.followed: Counter[str] = Counter()  # job id -> how many threads follow it
        self.answer: dict[str, tuple[str, str]] | None = None
        self.asked_at = float("-inf")

    def follow(self, ids: list[str]) -> None:
        with self.lock:
            self.followed.update(ids)
            self.asked_at = float("-inf")  # new jobs: the next poll asks

    def forget(self, ids: list[str]) -> None:
        with self.lock:
            self.followed -= Counter(ids)  # a job no thread follows any more is dropped

    def states(self, interval: float) -> dict[str, tuple[str, str]] | None:
        """{job id: (state, nodes)} of the followed jobs the controller knows; None when it did not answer. An
        answer younger than most of `interval` is shared."""
        with self.lock:
            if time.monotonic() - self.asked_at >= 0.9 * interval:
                self.answer, self.asked_at = _queue_states(sorted(self.followed)), time.monotonic()
            return self.answer


QUEUE = _Queue()
