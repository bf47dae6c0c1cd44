"""`launcher=slurm`: Hydra's submitit launcher, its jobs followed by attnlab's sweep driver
(attnlab/cluster/sweep_watch.py) instead of Hydra's wait on each job's `results()`, which asks `sacct` at every poll:
without accounting it never learns that a cancelled job is gone, and with it a cancelled job ends the whole sweep
with a traceback. When a job fails, the driver gathers the others; a grid's driver then exits 1 with one paragraph
naming them. Ctrl-C or SIGTERM of the driver cancels its jobs, each saving its `last.ckpt`, so that the same command
continues the sweep.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from attnlab.cluster.outcome import SlurmState
from attnlab.cluster.sweep_states import FINAL
from attnlab.cluster.sweep_watch import Watched, job_name, state_text, watch
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as HydraSlurmLauncher

log = logging.getLogger("attnlab")


class SweepJobError(CompactHydraException):
    """Jobs of a sweep that did not complete: Hydra prints its message alone (no traceback) and exits with 1."""


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
        failed = [w for w in watched if w.state != SlurmState.COMPLETED or not w.outcome or not w.outcome.ok]
        summary = _summary(failed, len(watched), sweep_dir)
        if failed and str(self.config.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper"):
            # a grid: Hydra's basic sweeper would stop at the first failed job with a traceback; the paragraph alone
            print(summary, file=sys.stderr, flush=True)
            raise SystemExit(1)
        return [returned(w, summary) for w in watched]  # a study's sweeper records each failed trial and goes on

    def _submit(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """Hydra's submission (its `launch` up to the wait): the executor, its parameters, one array of jobs."""
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides

        from attnlab.cluster.submitit_bridge import slurm_executor

        assert self.config is not None
        params = dict(self.params)
        # the job's tasks get the batch script's environment, where submitit names itself: a site whose sbatch
        # exports nothing (--export=NONE, SBATCH_EXPORT=NONE) has srun export nothing too
        srun_args = list(params.get("srun_args") or [])
        if not any(str(a).startswith("--export") for a in srun_args):
            params["srun_args"] = [*srun_args, "--export=ALL"]
        executor = slurm_executor(params, params["submitit_folder"])
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


def _summary(failed: list[Watched], total: int, sweep_dir: Path) -> str:
    if not failed:
        return ""
    jobs = "; ".join(f"job {w.id} ({job_name(w)}) {state_text(w)}, log {w.log_file()}"
                     for w in failed)
    return (f"attnlab: error: {len(failed)} of {total} SLURM jobs of this sweep did not complete: {jobs}. The others' "
            f"results are in {sweep_dir / 'results.csv'}; run the same command again for an Optuna sweep to rerun "
            "the stopped trials, or rerun a job alone with `python train.py --rerun <its folder>`.")


def returned(w: Watched, summary: str) -> JobReturn:
    """What Hydra's sweepers expect of a job: its JobReturn, or a failed one whose return value raises."""
    if w.state == SlurmState.COMPLETED and w.outcome is not None and w.outcome.ok:
        return w.outcome.value
    ret = JobReturn()
    ret.status = JobStatus.FAILED
    ret.overrides = w.overrides
    ret.return_value = SweepJobError(summary)
    return ret


