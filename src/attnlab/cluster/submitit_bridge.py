"""The bridge to submitit, the one module that touches its internals: the signal handler submitit installs in a job
of `launcher=slurm` (which requeues it), and its requeue told attnlab's answer (time limit or not) and the ledger's
count of time limits left, which its job pickle keeps; the executor Hydra's launcher builds, and the batch script it
would submit."""

from __future__ import annotations

import signal
import subprocess
import sys


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


def timeouts_left(handler, budget: int) -> int:
    """How many time limits submitit's job pickle still allows (its countdown), `budget` where it keeps none."""
    return getattr(getattr(handler, "_delayed", None), "_timeout_countdown", budget)


def requeue(handler, signum: int, timed_out: bool, countdown: int) -> tuple[bool, str]:
    """submitit's requeue of this job (`checkpoint_and_try_requeue`), told whether this is a time limit and how many
    time limits are left: (requeued, why not)."""
    from submitit.core.utils import UncompletedJobError

    handler.has_timed_out = lambda: timed_out
    handler._delayed._timeout_countdown = countdown
    try:
        handler.checkpoint_and_try_requeue(signum)
        return False, "submitit did not requeue it"
    except SystemExit:  # submitit's way out once the job is requeued
        return True, ""
    except UncompletedJobError as e:
        return False, f"submitit did not requeue it ({e})"
    except (OSError, subprocess.SubprocessError) as e:  # scontrol refused
        return False, f"scontrol requeue failed ({e})"
    finally:
        del handler.has_timed_out


def slurm_executor(params: dict, folder):
    """The `AutoExecutor` Hydra's submitit launcher builds for `hydra.launcher` = params (resolved), as its `launch`
    does: `max_num_timeout` given to its constructor, the keys of Hydra's `BaseQueueConf` as they are, any other as
    `slurm_<key>`."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    executor = submitit.AutoExecutor(cluster="slurm", folder=folder,
                                     slurm_max_num_timeout=params.get("max_num_timeout") or 0)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                  if k not in ("_target_", "submitit_folder", "max_num_timeout")})
    return executor


def batch_script(params: dict, folder, command: str, name: str) -> str:
    """The batch script the launcher submits for `command` with `hydra.launcher` = params (resolved): that of
    `slurm_executor`'s `_executor` (`_make_submission_file_text`), which `sbatch --test-only` is given."""
    return slurm_executor(params, folder)._executor._make_submission_file_text(command, name)
