"""`SignalGuard`: acts on SIGTERM and on SLURM's warning (SIGUSR1, and submitit's signal under launcher=slurm) during
training. It saves `last.ckpt` after the current step (every rank after the same one), tells a time limit from a
preemption by what SLURM says of the job, and carries out what attnlab.cluster.rules decides. Its handlers replace
Lightning's and submitit's during training, and never run a collective: ranks meet only after a step.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from attnlab.callbacks.run_metadata import RunMetadata, ledger_of, record_end, requeue_budget
from attnlab.cluster import submitit_bridge
from attnlab.cluster.exit import STOPPED
from attnlab.cluster.outcome import AttemptEnd, Cause, Outcome
from attnlab.cluster.rules import Decision, Event, JobState, decide, warning_cause
from attnlab.cluster.slurm_job import (TIME_LIMIT, being_preempted, in_slurm_job, job_fields, scontrol_requeue,
                                     seconds_left, slurm_requeues)
from attnlab.compat import stand_down_rank_observer, stop_after_this_step
from attnlab.cluster.submitit_bridge import submitit_handler, submitit_signals


class SignalGuard(Callback):
    def __init__(self, patience_s: float = 30.0):
        self.patience_s = patience_s
        self.received = 0  # SIGTERMs
        self.warned: int | None = None  # SLURM's warning signal, once received
        self.warned_at: float | None = None  # when (time.time()), to tell a time limit's warning by the time left
        self.ending = False  # saved after SLURM's warning: a SIGTERM now (the requeue's, the limit's) changes nothing
        self.listening = False  # to SLURM's warning
        self.preempted = False  # SLURM's SIGTERM of a preemption: SLURM requeues the job itself (PreemptMode=REQUEUE)
        self.step_started: float | None = None
        self.owns_sigterm = False
        self._trainer = None
        self._submitit = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # before Lightning registers its own SIGTERM handler, which calls the one it finds after its own
        self._trainer = trainer
        if stage != "fit":
            return
        self._submitit = submitit_handler()
        self.owns_sigterm = hasattr(signal, "SIGTERM") and _replaceable(signal.getsignal(signal.SIGTERM))
        if self.owns_sigterm:
            signal.signal(signal.SIGTERM, self.on_sigterm)
        if self._submitit is not None and _replaceable(signal.getsignal(signal.SIGCONT)):
            signal.signal(signal.SIGCONT, signal.SIG_DFL)  # submitit's only logs the SIGCONT that precedes a SIGTERM
        if hasattr(signal, "SIGUSR1") and in_slurm_job():
            warning_signals = {signal.SIGUSR1, *(submitit_signals() if self._submitit is not None else ())}
            for signum in warning_signals - {signal.SIGTERM}:
                signal.signal(signum, self.on_warning)
            self.listening = True

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self.take_sigterm()

    def on_train_start(self, trainer, pl_module) -> None:
        self.take_sigterm()

    def take_sigterm(self) -> None:
        """SIGTERM to this guard alone, once Lightning has put its handler around it (as `fit` begins its loops)."""
        if self.owns_sigterm and not self.ending and signal.getsignal(signal.SIGTERM) != self.on_sigterm:
            signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_started = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step_started = None
        self.decide_together(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """A signal that comes during fit's validation is acted on after the current validation batch, not after
        the next training step (a long validation would outlast the warning's lead). Every rank runs the same number
        of validation batches (the distributed sampler pads), so they decide together here too."""
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.decide_together(trainer)

    def decide_together(self, trainer) -> None:
        """In a run of several ranks, a signal that any rank has (SIGTERM, SLURM's warning) stops all of them after
        the same batch: a collective here, where every rank is at the same point, never in a signal handler."""
        if trainer.world_size == 1 or self.ending:
            return
        flags = torch.tensor([float(self.warned is not None), float(self.received > 0)],
                             device=trainer.strategy.root_device)
        warned, stopped = (trainer.strategy.reduce(flags, reduce_op="sum") > 0).tolist()
        if warned and self.listening:
            self.warned, self.warned_at = self.warned or signal.SIGUSR1, self.warned_at or time.time()
        if warned or stopped:
            stop_after_this_step(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """After training (the test pass and the report may follow): SIGTERM back to its default action, and SLURM's
        warning ignored, as there is nothing left to save or requeue (its default action would end the process)."""
        if stage != "fit":
            return
        if signal.getsignal(signal.SIGTERM) == self.on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.listening:
            for signum in {signal.SIGUSR1, *(submitit_signals() if self._submitit is not None else ())}:
                signal.signal(signum, signal.SIG_IGN)
            if self.warned is not None and trainer.is_global_zero:
                os.write(2, f"attnlab: {signal.Signals(self.warned).name} came as training ended: nothing to "
                            "requeue, the job goes on to its end.\n".encode())

    def on_sigterm(self, signum, frame) -> None:
        """SLURM's preemption (a PreemptTime) is a warning, the end a warning announced changes nothing while the step
        runs, any other SIGTERM stops; noted in the ledger at once."""
        if self.ending:
            return
        if not self.received and self.warned is None and self.listening and being_preempted():
            # SLURM's preemption (PreemptMode=REQUEUE): its SIGTERM is the warning, the grace time the lead
            self.preempted = True
            ledger_of(self._trainer).note(Cause.PREEMPTED, unless_said=True)
            self.on_warning(signum, frame)
            return
        running = time.monotonic() - self.step_started if self.step_started is not None else 0.0
        decision = decide(Event.SIGTERM_AGAIN if self.received else Event.SIGTERM,
                          JobState(step_s=running, patience_s=self.patience_s, warned=self.warned is not None))
        if decision.exit_code is None:
            return
        if not self.received and self._trainer is not None:
            ledger_of(self._trainer).note(Cause.SIGTERM, unless_said=True)
        self.received += 1
        if decision.at_once:
            self.stop_now(decision)
        elif self._trainer is not None and self._trainer.world_size == 1:  # several ranks: decide_together
            stop_after_this_step(self._trainer)

    def on_warning(self, signum, frame) -> None:
        """SLURM's warning before a time limit or a preemption: stop after the current step, then requeue
        (on_exception)."""
        if self.warned is not None or self._trainer is None:
            return
        self.warned, self.warned_at = signum, time.time()
        if self._trainer.world_size == 1:  # several ranks decide together, at the end of the step (on_train_batch_end)
            stop_after_this_step(self._trainer)
        if self._trainer.is_global_zero:
            os.write(2, f"\nattnlab: {signal.Signals(signum).name} (SLURM's warning of a time limit or a preemption): "
                        "stopping after the current step, to save it and requeue the job.\n".encode())

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Lightning's stop on a signal (a SIGTERMException, a SystemExit that would exit 0) gets the status STOPPED
        and one line saying what it saved; after SLURM's warning, last.ckpt is saved first and the job requeued."""
        if not isinstance(exception, SIGTERMException):
            return
        exception.code = STOPPED
        stand_down_rank_observer()  # every rank stops after this step and ends with STOPPED
        if self.warned is not None:
            self.save_last(trainer)
            self.requeue(trainer)
            return
        record_end(trainer, decide(Event.SIGTERM, JobState()).end, signal="SIGTERM")
        last = self.saved(trainer)
        kept = (f"step {trainer.global_step} is saved in {last}; resume from it with ckpt_path={last}" if last
                else "no checkpoint is configured (callbacks.model_checkpoint), so nothing was saved")
        os.write(2, f"\nattnlab: stopped on SIGTERM: {kept}. Exit status {STOPPED} (preempted, not finished).\n"
                 .encode())

    def requeue(self, trainer) -> None:
        """Requeue the job, within its budget of time limits (the ledger: cluster/slurm_job.py); its rank 0 does, and
        says in one line and in the lineage how this attempt ended."""
        # the requeue's SIGTERM reaches every rank: this handler alone takes it, not Lightning's, whose broadcast to
        # the ranks would meet ranks that have already gone
        self.ending = True
        signal.signal(signal.SIGTERM, self.on_sigterm)
        if not trainer.is_global_zero:
            return
        name = signal.Signals(self.warned).name
        cause = self.cause(trainer, job_fields())
        end, why = self.ask_requeue(trainer, cause)
        last = self.saved(trainer)
        kept = f"step {trainer.global_step} is saved in {last}" if last else "nothing was saved (no checkpoint " \
            "is configured: callbacks.model_checkpoint)"
        if end.outcome is Outcome.REQUEUED:
            record_end(trainer, end, signal=name)
            os.write(2, f"attnlab: {name} ({cause}): {kept}; the job is requeued and continues from it in this "
                        f"folder. Exit status {STOPPED}.\n".encode())
            return
        record_end(trainer, end, signal=name, not_requeued=why)
        resume = f" Resume from it with ckpt_path={last}." if last else ""
        os.write(2, f"attnlab: {name} ({cause}): {kept}. The job is not requeued: {why}.{resume} Exit status "
                    f"{STOPPED} (not finished).\n".encode())

    def cause(self, trainer, fields: dict[str, str]) -> Cause:
        """Why SLURM warned (`fields`: scontrol show job), as cluster/rules.warning_cause tells it."""
        launcher = (getattr(RunMetadata.of(trainer), "lineage", None) or {}).get("launcher") or {}
        try:
            lead = float(launcher["signal_delay_s"])
        except (KeyError, TypeError, ValueError):
            lead = None
        return warning_cause(self.preempted or being_preempted(fields), under_submitit=self._submitit is not None,
                             left_s=seconds_left(fields, self.warned_at or time.time()), lead_s=lead,
                             timed_out=lambda: self._submitit.has_timed_out())

    def ask_requeue(self, trainer, cause: Cause) -> tuple[AttemptEnd, str]:
        """Note the requeue in the ledger and ask for it, within the budget of time limits (cluster/rules.py): (how
        the attempt ends, why it is not requeued). When SLURM refuses, what it says of the job decides
        (slurm_job.slurm_requeues)."""
        ledger, (budget, named) = ledger_of(trainer), requeue_budget(trainer)
        # time limits spent: the ledger's, or more where submitit requeued on its own (a warning before training)
        spent = max(ledger.spent(TIME_LIMIT), budget - submitit_bridge.timeouts_left(self._submitit, budget)
                    if self._submitit is not None else 0)
        state = JobState(in_slurm=True, cause=cause, spent=spent if cause == TIME_LIMIT else 0, budget=budget)
        decision = decide(Event.WARNING, state)
        if not decision.requeue:
            return decision.end, (f"it has reached its time limit launcher.max_num_timeout times already ({spent} "
                                  f"requeues for a time limit, {named}); give it a longer launcher.timeout_min or a "
                                  "larger launcher.max_num_timeout")
        note = ledger.note(cause, rank=trainer.global_rank, global_step=trainer.global_step,
                           signal=signal.Signals(self.warned).name)
        if self._submitit is not None:
            requeued, why = submitit_bridge.requeue(self._submitit, self.warned, cause == TIME_LIMIT,
                                                    max(0, budget - spent))
        else:
            requeued, why = scontrol_requeue()
        if not requeued:
            requeued, why_not = slurm_requeues(job_fields(), cause is Cause.PREEMPTED)
            why = "; ".join(filter(None, (why, why_not)))
        if requeued:
            return decision.end, ""
        if note is not None:
            note.unlink(missing_ok=True)
        return decide(Event.REQUEUE_REFUSED, state).end, why

    @staticmethod
    def save_last(trainer) -> None:
        ckpt = getattr(trainer, "checkpoint_callback", None)
        if ckpt is not None and hasattr(ckpt, "save_last_now") and not trainer.sanity_checking:
            ckpt.save_last_now(trainer)

    @staticmethod
    def saved(trainer) -> Path | None:
        """Where last.ckpt is saved, when the run saves one."""
        ckpt = getattr(trainer, "checkpoint_callback", None)
        if ckpt is not None and getattr(ckpt, "save_last", False) and getattr(ckpt, "dirpath", None):
            return Path(ckpt.dirpath) / "last.ckpt"
        return None

    def last_checkpoint(self) -> str | None:
        ckpt = getattr(self._trainer, "checkpoint_callback", None)
        path = getattr(ckpt, "last_model_path", "") or ""
        if not path and getattr(ckpt, "dirpath", None):
            path = str(Path(ckpt.dirpath) / "last.ckpt")
        return path if path and Path(path).is_file() else None

    def stop_now(self, decision: Decision) -> None:
        from attnlab.cluster.exit import end_at_once

        last = self.last_checkpoint()
        kept = (f"the last checkpoint is {last}; resume from it with ckpt_path={last}" if last
                else "no checkpoint had been saved yet")
        if self._trainer is not None:
            record_end(self._trainer, decision.end, signal="SIGTERM")
        why = decision.end.detail
        os.write(2, f"\nattnlab: stopped at once on {why}: the current step is lost; {kept}.\n".encode())
        end_at_once(decision.exit_code)


def _replaceable(handler) -> bool:
    """A SIGTERM handler SignalGuard takes over: none, submitit's (it only logs), or an earlier run's guard (a
    multirun's jobs in one process)."""
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return True
    owner = getattr(handler, "__self__", None)
    return isinstance(owner, SignalGuard) or type(owner).__module__.startswith("submitit.")
