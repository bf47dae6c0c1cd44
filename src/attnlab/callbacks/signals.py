"""Signals during training, each acted on by one handler: this module's `SignalGuard`.

SIGTERM (`kill`, `scancel`, the end of a time limit) and Ctrl-C: the first one saves `last.ckpt` at the end of the
current step and stops (Lightning's stop, with ModelCheckpoint.on_exception); a second one, or the first when the
current step has already run for `patience_s` seconds (a run too large for the machine, a hung collective), stops the
process at once, naming the checkpoint that the last save left. A run stopped by SIGTERM ends with status 143
(128 + SIGTERM), as a process killed by it would, so that a scheduler or pipeline does not record a preempted run as
finished; its lineage says `stopped`.

SLURM's warning before a time limit or a preemption (`--signal=USR1@<seconds>`, which `launcher=slurm` asks for):
SIGUSR1, and in a submitit job submitit's own signal too ($SUBMITIT_PREEMPT_SIGNAL, SIGUSR2 by default). The current
step ends (on every rank of a multi-node job: they decide together, after the same step, or after the same
validation batch when the warning comes during validation), `last.ckpt` is saved at it, then the job is requeued and
continues from that file in its own folder. Rank 0 decides why SLURM warned, from what SLURM says of the job:
- `preempted`: SLURM's SIGTERM while the job has a `PreemptTime` (scontrol show job), or its warning then;
- under launcher=slurm, `time limit` when the warning came within `launcher.signal_delay_s` (and SLURM's minute of
  slack) of the job's `EndTime`, else `preempted` (a warning sent by hand, or by a site's tools before a preemption);
- in a batch script of the user's own (`srun python train.py ...`), whose lead is not known, `SLURM's warning`.
Time limits are counted against `launcher.max_num_timeout` in the job's ledger of requeues (callbacks/peers.py), the
record that holds the lost-peer budget too; preemptions and warnings in one's own script are not counted. Past the
budget the job is not requeued: the run ends with status 143, its lineage and last line saying why.

submitit's countdown does not decide: its `checkpoint_and_try_requeue` calls a warning a time limit once the job has
run 80% of its limit or all but 10 minutes (a late preemption too), and counts in its job pickle. Rank 0 requeues
through it (it writes its pickle, then runs `scontrol requeue`; `scontrol requeue` in one's own script), telling it
attnlab's answer and the ledger's count, which its pickle keeps for a warning before the next attempt trains (its to
handle: it requeues at once); such requeues of its own count as spent too (the larger count wins).

A requeue that SLURM refuses is not recorded as one: `scontrol show job` decides. The job is requeued when SLURM has
requeued it already, or is preempting it under `PreemptMode=REQUEUE` (the partition's, else the cluster's) and may
(`Requeue=1`); otherwise (`--no-requeue`, `PreemptMode=CANCEL`) the lineage says `stopped: preempted, not requeued`
with why. Each attempt ends with status 143 and a lineage record of how it ended; a requeued one adds its own.

Lightning's own SLURM handler, which would save `hpc_ckpt_<n>.ckpt` and requeue too, is off: `slurm_environment()`
gives the trainer Lightning's SLURM environment without it (builders.build_trainer). submitit's SIGTERM and SIGCONT
handlers, which only log, are replaced during training, and so is Lightning's SIGTERM handler once the requeue is
asked for (the requeue's SIGTERM then changes nothing). Before training starts, SLURM's warning is submitit's to
handle where it is submitit's signal (it requeues at once: nothing is lost); once training has ended it is ignored
(the test pass and the report need no requeue).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from attnlab.callbacks.requeues import in_slurm_job, slurm_job_id  # noqa: E402,F401  (where callers import them)

STOPPED = 128 + signal.SIGTERM  # the status of a run stopped by a signal: not finished
# SLURM sends --signal up to a minute before the time it was asked for (its controller's checks): a warning within a
# job's lead and this much of its end time is its time limit's
WARNING_SLACK_S = 90.0



def slurm_environment():
    """Lightning's SLURM environment (ranks, nodes, rendezvous) without its requeue handler, under SLURM; else None.
    SignalGuard alone acts on SLURM's warning signal. Under torchrun inside a SLURM job (`srun ... torchrun ...` in
    a batch script) torchrun's environment wins, as Lightning itself decides (TorchElasticEnvironment first)."""
    from lightning.fabric.plugins.environments import TorchElasticEnvironment

    if not in_slurm_job() or TorchElasticEnvironment.detect():
        return None
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment(auto_requeue=False)



def being_preempted(fields: dict[str, str] | None = None) -> bool:
    """Whether SLURM is preempting this job now: the controller has given it a preemption time (`PreemptTime` of
    `scontrol show job`), which a cancellation, a time limit or a plain kill does not. False when it cannot say."""
    from attnlab.callbacks.requeues import job_fields

    fields = job_fields() if fields is None else fields
    return fields.get("PreemptTime", "None") not in ("None", "Unknown", "")


def submitit_handler():
    """The signal handler submitit installed in this job (launcher=slurm), which requeues it; None elsewhere."""
    if "submitit" not in sys.modules:
        return None
    for signum in (signal.SIGTERM, *submitit_signals()):
        owner = getattr(signal.getsignal(signum), "__self__", None)
        if type(owner).__module__.startswith("submitit.") and hasattr(owner, "checkpoint_and_try_requeue"):
            return owner
    return None


def submitit_signals() -> tuple[signal.Signals, ...]:
    """The signal submitit requeues on in this process ($SUBMITIT_PREEMPT_SIGNAL, SIGUSR2 by default)."""
    from submitit import JobEnvironment

    found = getattr(signal, "SIG" + str(JobEnvironment.USR_SIG), None)
    return (found,) if found is not None else ()


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
        self._trainer = None
        self._submitit = None

    @staticmethod
    def of(trainer) -> SignalGuard | None:
        return next((c for c in trainer.callbacks if isinstance(c, SignalGuard)), None)

    def setup(self, trainer, pl_module, stage: str) -> None:
        # before Lightning registers its own SIGTERM handler, which calls the one it finds after its own
        self._trainer = trainer
        if stage != "fit":
            return
        self._submitit = submitit_handler()
        if hasattr(signal, "SIGTERM") and _replaceable(signal.getsignal(signal.SIGTERM)):
            signal.signal(signal.SIGTERM, self.on_sigterm)
        if self._submitit is not None and _replaceable(signal.getsignal(signal.SIGCONT)):
            signal.signal(signal.SIGCONT, signal.SIG_DFL)  # submitit's only logs the SIGCONT that precedes a SIGTERM
        if hasattr(signal, "SIGUSR1") and in_slurm_job():
            warning_signals = {signal.SIGUSR1, *(submitit_signals() if self._submitit is not None else ())}
            for signum in warning_signals - {signal.SIGTERM}:
                signal.signal(signum, self.on_warning)
            self.listening = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_started = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step_started = None
        self.decide_together(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """A warning that comes during validation is acted on after the current validation batch, not after the
        next training step (a long validation would outlast the warning's lead). Every rank runs the same number of
        validation batches (the distributed sampler pads), so they decide together here too; the loop then stops
        (Lightning's SIGTERMException mid-evaluation). last.ckpt holds the last training step, and the requeued
        run runs the interrupted validation again whole before it trains on (callbacks/checkpoint.py)."""
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.decide_together(trainer)

    def decide_together(self, trainer) -> None:
        """In a run of several ranks, stop on SLURM's warning when any rank has it: all of them, after the same
        batch (a collective, so each rank reaches it at the same point)."""
        if self.listening and trainer.world_size > 1 and not self.ending:
            if trainer.strategy.reduce_boolean_decision(self.warned is not None, all=False):
                from attnlab.compat import stop_after_this_step

                self.warned, self.warned_at = self.warned or signal.SIGUSR1, self.warned_at or time.time()
                stop_after_this_step(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """Training has ended (the test pass and the report follow): SLURM's warning from now on has nothing to
        save and needs no requeue, and is ignored (not left to end the process: its default action)."""
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
        """SLURM's preemption (a PreemptTime) is a warning, any other SIGTERM stops; noted in the ledger at once."""
        from attnlab.callbacks.requeues import Ledger

        if self.ending:
            return
        if not self.received and self.warned is None and self.listening and being_preempted():
            # SLURM's preemption (PreemptMode=REQUEUE): its SIGTERM is the warning, the grace time the lead
            self.preempted = True
            Ledger.of(self._trainer).note("preempted", unless_said=True)
            self.on_warning(signum, frame)
            return
        if not self.received and self._trainer is not None:
            Ledger.of(self._trainer).note("stopped", unless_said=True)
        self.received += 1
        running = time.monotonic() - self.step_started if self.step_started is not None else 0.0
        if self.received == 1 and running < self.patience_s:
            return  # Lightning stops after this step and saves last.ckpt
        why = "a second SIGTERM" if self.received > 1 else f"SIGTERM while a step has run for {running:.0f} s"
        self.stop_now(why)

    def on_warning(self, signum, frame) -> None:
        """SLURM's warning before a time limit or a preemption: stop after the current step, then requeue
        (on_exception)."""
        from attnlab.compat import stop_after_this_step

        if self.warned is not None or self._trainer is None:
            return
        self.warned, self.warned_at = signum, time.time()
        if self._trainer.world_size == 1:  # several ranks decide together, at the end of the step (on_train_batch_end)
            stop_after_this_step(self._trainer)
        if self._trainer.is_global_zero:
            os.write(2, f"\nattnlab: {signal.Signals(signum).name} (SLURM's warning of a time limit or a preemption): "
                        "stopping after the current step, to save it and requeue the job.\n".encode())

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Lightning's stop on a signal is a SystemExit without a code (status 0, as if the run had finished): say
        what was saved and give it SIGTERM's status. On SLURM's warning, save last.ckpt now (attnlab's
        ModelCheckpoint, whose save comes later in this round of hooks, then finds this step saved) and requeue."""
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not isinstance(exception, SIGTERMException):
            return
        exception.code = STOPPED
        if self.warned is not None:
            self.save_last(trainer)
            self.requeue(trainer)
            return
        self.record(trainer, "stopped", signal="SIGTERM")
        last = self.saved(trainer)
        kept = (f"step {trainer.global_step} is saved in {last}; resume from it with ckpt_path={last}" if last
                else "no checkpoint is configured (callbacks.model_checkpoint), so nothing was saved")
        os.write(2, f"\nattnlab: stopped on SIGTERM: {kept}. Exit status {STOPPED} (preempted, not finished).\n"
                 .encode())

    def requeue(self, trainer) -> None:
        """Requeue the job, within its budget of time limits (the ledger of callbacks/peers.py); its rank 0 does, and
        says in one line and in the lineage how this attempt ended."""
        # the requeue's SIGTERM reaches every rank: this handler alone takes it, not Lightning's, whose broadcast to
        # the ranks would meet ranks that have already gone
        self.ending = True
        signal.signal(signal.SIGTERM, self.on_sigterm)
        if not trainer.is_global_zero:
            return
        from attnlab.callbacks.requeues import job_fields

        name = signal.Signals(self.warned).name
        cause = self.cause(trainer, job_fields())
        requeued, why = self.ask_requeue(trainer, cause)
        last = self.saved(trainer)
        kept = f"step {trainer.global_step} is saved in {last}" if last else "nothing was saved (no checkpoint " \
            "is configured: callbacks.model_checkpoint)"
        if requeued:
            self.record(trainer, f"requeued: {cause}", signal=name)
            os.write(2, f"attnlab: {name} ({cause}): {kept}; the job is requeued and continues from it in this "
                        f"folder. Exit status {STOPPED}.\n".encode())
            return
        self.record(trainer, f"stopped: {cause}, not requeued", signal=name, not_requeued=why)
        resume = f" Resume from it with ckpt_path={last}." if last else ""
        os.write(2, f"attnlab: {name} ({cause}): {kept}. The job is not requeued: {why}.{resume} Exit status "
                    f"{STOPPED} (not finished).\n".encode())

    def cause(self, trainer, fields: dict[str, str]) -> str:
        """Why SLURM warned, as SLURM tells it (`fields`: scontrol show job): the module docstring's rules."""
        from attnlab.callbacks.requeues import seconds_left
        from attnlab.callbacks.run_metadata import RunMetadata

        if self.preempted or being_preempted(fields):
            return "preempted"
        if self._submitit is None:
            return "SLURM's warning"
        launcher = (getattr(RunMetadata.of(trainer), "lineage", None) or {}).get("launcher") or {}
        left = seconds_left(fields, self.warned_at or time.time())
        try:
            return "time limit" if left <= float(launcher["signal_delay_s"]) + WARNING_SLACK_S else "preempted"
        except (KeyError, TypeError, ValueError):  # no end time or lead known: submitit's judgement by time run
            return "time limit" if self._submitit.has_timed_out() else "preempted"

    def ask_requeue(self, trainer, cause: str) -> tuple[bool, str]:
        """Note the requeue in the ledger and ask for it, within the budget of time limits: (requeued, why not).
        When SLURM refuses, what it says of the job decides (peers.slurm_requeues)."""
        from attnlab.callbacks.requeues import (TIME_LIMIT, Ledger, job_fields, max_requeues, scontrol_requeue,
                                             slurm_requeues)

        ledger, (budget, named) = Ledger.of(trainer), max_requeues(trainer)
        # time limits spent: the ledger's, or more where submitit requeued on its own (a warning before training)
        countdown = getattr(getattr(self._submitit, "_delayed", None), "_timeout_countdown", budget)
        spent = max(ledger.spent(TIME_LIMIT), budget - countdown if self._submitit is not None else 0)
        if cause == TIME_LIMIT and spent >= budget:
            return False, (f"it has reached its time limit launcher.max_num_timeout times already ({spent} requeues "
                           f"for a time limit, {named}); give it a longer launcher.timeout_min or a larger "
                           "launcher.max_num_timeout")
        note = ledger.note(cause, rank=trainer.global_rank, global_step=trainer.global_step,
                           signal=signal.Signals(self.warned).name)
        if self._submitit is not None:
            requeued, why = self._submitit_requeue(cause == TIME_LIMIT, max(0, budget - spent))
        else:
            requeued, why = scontrol_requeue()
        if not requeued:
            requeued, why_not = slurm_requeues(job_fields(), cause == "preempted")
            why = "; ".join(filter(None, (why, why_not)))
        if not requeued and note is not None:
            note.unlink(missing_ok=True)
        return requeued, why

    def _submitit_requeue(self, timed_out: bool, countdown: int) -> tuple[bool, str]:
        """submitit's requeue of this job (`checkpoint_and_try_requeue`), told whether this is a time limit and how
        many time limits are left (the ledger's count)."""
        from submitit.core.utils import UncompletedJobError

        handler = self._submitit
        handler.has_timed_out = lambda: timed_out
        handler._delayed._timeout_countdown = countdown
        try:
            handler.checkpoint_and_try_requeue(self.warned)
            return False, "submitit did not requeue it"
        except SystemExit:  # submitit's way out once the job is requeued
            return True, ""
        except UncompletedJobError as e:
            return False, f"submitit did not requeue it ({e})"
        except (OSError, subprocess.SubprocessError) as e:  # scontrol refused
            return False, f"scontrol requeue failed ({e})"
        finally:
            del handler.has_timed_out

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

    @staticmethod
    def record(trainer, status: str, **fields) -> None:
        """How this attempt ended, in the run's lineage (RunMetadata)."""
        from attnlab.callbacks.run_metadata import RunMetadata

        metadata = RunMetadata.of(trainer)
        if metadata is not None:
            metadata.finish(trainer, status, **fields)

    def last_checkpoint(self) -> str | None:
        ckpt = getattr(self._trainer, "checkpoint_callback", None)
        path = getattr(ckpt, "last_model_path", "") or ""
        if not path and getattr(ckpt, "dirpath", None):
            path = str(Path(ckpt.dirpath) / "last.ckpt")
        return path if path and Path(path).is_file() else None

    def stop_now(self, why: str) -> None:
        last = self.last_checkpoint()
        kept = (f"the last checkpoint is {last}; resume from it with ckpt_path={last}" if last
                else "no checkpoint had been saved yet")
        if self._trainer is not None:
            self.record(self._trainer, f"stopped at once: {why}", signal="SIGTERM")
        os.write(2, f"\nattnlab: stopped at once on {why}: the current step is lost; {kept}.\n".encode())
        end_at_once(STOPPED)


def end_at_once(code: int, wandb_wait_s: float = 10.0) -> None:
    """End the process now, without unwinding (a step or a collective may never return), leaving nothing half
    done that can be ended: the temporary file of a write under way (a checkpoint) is removed, and a W&B run is
    marked ended with `code` (failed), waiting at most `wandb_wait_s` for it."""
    import threading

    from attnlab.utils.atomic import remove_unfinished

    remove_unfinished()
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        finishing = threading.Thread(target=wandb.finish, kwargs={"exit_code": code}, daemon=True)
        finishing.start()
        finishing.join(wandb_wait_s)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _replaceable(handler) -> bool:
    """A SIGTERM handler SignalGuard takes over: none, submitit's (it only logs), or an earlier run's guard (a
    multirun's jobs in one process)."""
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return True
    owner = getattr(handler, "__self__", None)
    return isinstance(owner, SignalGuard) or type(owner).__module__.startswith("submitit.")
