"""The Optuna sweeper's implementation (see optuna_sweeper.py), imported when a sweep is set up."""

import logging
import time
from pathlib import Path
from typing import Any, Optional

import optuna
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from attnlab.compat import optuna_trial_id, set_stored_attr, stored_trial
from attnlab.errors import UserError

from ._search_space import grid, search_space

log = logging.getLogger(__name__)
INTERRUPTED = "interrupted"  # user attribute of a trial whose process was stopped: run again, not counted


class StudyError(UserError, ValueError):
    """A study this sweep cannot continue: printed as attnlab's one-paragraph errors are, without a traceback."""


class OptunaSweeperImpl(Sweeper):
    def __init__(self, sampler: Any = None, direction: Any = "minimize", storage: Optional[str] = None,
                 study_name: Optional[str] = None, n_trials: int = 20, n_jobs: int = 1,
                 max_failure_rate: float = 0.0, pruner: Any = None, params: Optional[DictConfig] = None) -> None:
        self.sampler = sampler
        self.directions = [direction] if isinstance(direction, str) else list(direction)
        self.storage, self.study_name = storage, study_name
        self.n_trials, self.n_jobs, self.max_failure_rate = n_trials, max(1, n_jobs), max_failure_rate
        self.params = params
        self.grid_done = False  # a grid sampler has visited every point
        self.pruner = OmegaConf.to_container(pruner, resolve=True) if isinstance(pruner, DictConfig) else pruner

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function)

    # -- where the study lives ---------------------------------------------------------------------------------
    def _study_name(self) -> str:
        return self.study_name or str(OmegaConf.select(self.config, "task_name", default=None) or "optuna")

    def _storage(self) -> tuple[Optional[str], Optional[Path]]:
        """(Optuna storage URL or None for memory, the lock file of a SQLite study)."""
        if self.storage == "memory":
            return None, None
        if self.storage:
            url = str(self.storage)
            db = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        else:
            root = OmegaConf.select(self.config, "paths.log_dir", default=None)
            task = OmegaConf.select(self.config, "task_name", default=None)
            base = Path(root) / task if root and task else Path(self.config.hydra.sweep.dir).parent
            db = base / "optuna" / f"{self._study_name()}.db"
            url = f"sqlite:///{db}"
        if db is None:
            return url, None
        db.parent.mkdir(parents=True, exist_ok=True)
        return url, db.with_name(db.name + ".lock")

    def _sampler(self, space: dict, n_before: int) -> optuna.samplers.BaseSampler | None:
        """The configured sampler; a study continued after n_before trials seeds it with seed + n_before, so that
        a seeded search does not draw its first points again."""
        sampler = self.sampler
        if isinstance(sampler, (dict, DictConfig)):
            kwargs: dict[str, Any] = {}
            if n_before and sampler.get("seed") is not None:
                kwargs["seed"] = int(sampler["seed"]) + n_before
            if str(sampler.get("_target_", "")).endswith("GridSampler"):
                kwargs["search_space"] = grid(space)
            sampler = instantiate(sampler, **kwargs)
        return sampler

    # -- the sweep ----------------------------------------------------------------------------------------------
    def _sweep(self, arguments: list[str]) -> None:
        from filelock import FileLock, Timeout

        if not isinstance(self.n_trials, int) or self.n_trials < 1:
            raise StudyError(f"hydra.sweeper.n_trials={self.n_trials}: a sweep needs at least one trial (it is the "
                              "study's total; a continued study runs what is missing). Give it a positive number.")
        params = [f"{k}={v}" for k, v in (self.params or {}).items()]
        space, fixed = search_space(params + list(arguments))
        url, lock_path = self._storage()
        lock = FileLock(str(lock_path)) if lock_path else None
        try:
            if lock:
                lock.acquire(timeout=0)
        except Timeout:
            raise StudyError(
                f"Another sweep is running the Optuna study '{self._study_name()}' ({url}; its lock {lock_path} is "
                "held). Wait for it to finish, or give this sweep a study of its own: "
                "hydra.sweeper.study_name=<name>.") from None
        try:
            study = self._load(url, space)
            self._run(study, space, fixed, url)
        finally:
            if lock:
                lock.release()

    def sweep(self, arguments: list[str]) -> None:
        """Hydra prints an exception raised here with its traceback: a study that cannot be continued is refused
        as a run's bad input is, in one paragraph (attnlab.errors.fail)."""
        try:
            self._sweep(arguments)
        except StudyError as e:
            from attnlab.errors import fail

            fail(e)

    def _load(self, url: Optional[str], space: dict) -> optuna.Study:
        name = self._study_name()
        from attnlab.optuna_pruners import make_pruner

        for attempt in range(4):
            try:
                study = optuna.create_study(study_name=name, storage=url, directions=self.directions,
                                            load_if_exists=True, pruner=make_pruner(self.pruner))
                break
            except Exception as e:  # sqlalchemy's DatabaseError: not a database, cut short, another schema
                if url is None or not url.startswith("sqlite:///"):
                    raise
                if attempt == 3:
                    db = url.removeprefix("sqlite:///")
                    raise StudyError(
                        f"The Optuna study database {db} cannot be read ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160]}): it is damaged, e.g. cut short by a full disk or a copy "
                        f"killed half-way. Nothing was changed in it. Move it aside to start the study anew (mv {db} "
                        f"{db}.damaged), or give this sweep another study: hydra.sweeper.storage=sqlite:///<file> or "
                        "hydra.sweeper.study_name=<name>.") from None
                # or another process (a second sweep, optuna-dashboard, a notebook's load_study) creating the same
                # new database's tables at this moment
                time.sleep(0.5 * (attempt + 1))
        sampler = self._sampler(space, n_before=len(study.trials))
        if sampler is not None:  # none configured: Optuna's default (TPE)
            study.sampler = sampler
        found = [d.name.lower() for d in study.directions]
        if found != [d.lower() for d in self.directions]:
            raise StudyError(
                f"The Optuna study '{name}' in {url} was started to {', '.join(found)}, and this sweep asks to "
                f"{', '.join(self.directions)} (hydra.sweeper.direction). Give the new search its own study: "
                "hydra.sweeper.study_name=<name>.")
        # holding the lock, a trial still running was stopped with its process: fail it, run it again
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if set(trial.params) != set(space):  # stopped while its parameters were drawn (one write each): it
                # never trained, and what it holds is no configuration of this search space
                _interrupted(study, trial, again=False)
                log.warning(f"Trial {trial.number} of study '{name}' was interrupted before all its parameters were "
                            "drawn: a new trial takes its place.")
                continue
            _interrupted(study, trial)
            log.warning(f"Trial {trial.number} of study '{name}' was interrupted: it runs again.")
        return study

    @staticmethod
    def _finished(study: optuna.Study) -> int:
        return sum(1 for t in study.get_trials(deepcopy=False)
                   if t.state.is_finished() and not t.user_attrs.get(INTERRUPTED))

    def _run(self, study: optuna.Study, space: dict, fixed: dict, url: Optional[str]) -> None:
        done = self._finished(study)
        to_go = self.n_trials - done
        where = url or "memory"
        if done:
            log.info(f"Continuing Optuna study '{study.study_name}' ({where}): {done} of {self.n_trials} trials "
                     f"finished, {max(to_go, 0)} to run.")
        else:
            log.info(f"Optuna study '{study.study_name}' ({where}): {self.n_trials} trials.")
        if self.pruner is not None and url is None:  # jobs of this process find it by name
            from attnlab.callbacks.optuna_pruning import IN_PROCESS

            IN_PROCESS[study.study_name] = study
        if self.n_jobs > 1 and type(self.launcher).__name__ != "BasicLauncher":
            self._run_async(study, space, fixed, url, to_go)
            to_go = 0
        # one job at a time in this process (Hydra's basic launcher), or batches of n_jobs
        while to_go > 0 and not self.grid_done:
            batch = [study.ask(space) for _ in range(min(self.n_jobs, to_go))]
            overrides = [self._job_overrides(t, study, fixed, url) for t in batch]
            try:
                returns = self.launcher.launch(overrides, initial_job_idx=batch[0].number)
            except BaseException:  # SIGTERM (Lightning's SIGTERMException), Ctrl-C: these trials run again
                for trial in batch:
                    _interrupted(study, trial)
                raise
            failures = [self._tell(study, trial, ret) for trial, ret in zip(batch, returns)]
            failed = [ret for ret, fail in zip(returns, failures) if fail]
            if failed and len(failed) / len(returns) > self.max_failure_rate:
                failed[0].return_value  # raises the job's own exception, with its traceback
            to_go -= len(batch)
        self._save_results(study, where)

    def _run_async(self, study: optuna.Study, space: dict, fixed: dict, url: Optional[str], to_go: int) -> None:
        """Up to n_jobs trials at once, each launched alone (a submitit job): a new trial is asked for as soon as
        any one ends, with what the study knows then, so no worker waits for the slowest trial of a batch. Each
        running trial holds a slot: its own GPU on a machine with several, its share of the CPU cores."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        slots, running, failed, told = list(range(self.n_jobs)), {}, [], 0
        with ThreadPoolExecutor(self.n_jobs) as pool:
            try:
                while to_go > 0 or running:
                    while to_go > 0 and slots and not failed and not self.grid_done:
                        trial, slot = study.ask(space), slots.pop(0)
                        overrides = self._job_overrides(trial, study, fixed, url) + self._slot_env(slot)
                        future = pool.submit(self.launcher.launch, [overrides], initial_job_idx=trial.number)
                        running[future] = (trial, slot)
                        to_go -= 1
                    if not running:
                        break
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        trial, slot = running.pop(future)
                        slots.append(slot)
                        (ret,) = future.result()
                        told += 1
                        if self._tell(study, trial, ret):
                            failed.append(ret)
                    if failed and len(failed) / told > self.max_failure_rate:
                        to_go = 0  # launch nothing more; the running trials finish
            except BaseException:  # SIGTERM, Ctrl-C: the running trials run again next time
                for trial, _ in running.values():
                    _interrupted(study, trial)
                raise
        if failed and len(failed) / max(told, 1) > self.max_failure_rate:
            failed[0].return_value  # raises the job's own exception, with its traceback

    def _slot_env(self, slot: int) -> tuple[str, ...]:
        """A running trial's share of this machine: GPU number `slot` where there are several GPUs, else
        cores / n_jobs threads. A SLURM launcher's jobs get theirs from SLURM."""
        import os

        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

        if isinstance(self.launcher, SlurmLauncher):
            return ()
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        gpus = visible or [str(i) for i in range(_gpu_count())]
        if len(gpus) > 1:
            return (f"++hydra.job.env_set.CUDA_VISIBLE_DEVICES={gpus[slot % len(gpus)]}",)
        from attnlab.utils.cpus import usable_cpus

        threads = max(1, usable_cpus() // self.n_jobs)  # the CPUs this process was given, not the host's
        return tuple(f"++hydra.job.env_set.{v}={threads}" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))

    def _record(self, study: optuna.Study, trial: Any, values: Any = None, state: Any = None) -> None:
        """study.tell; a grid sampler whose grid is complete asks the study to stop (which Optuna allows only
        inside study.optimize): the trial is recorded all the same, and the sweep launches nothing more."""
        try:
            study.tell(trial, values, state=state)
        except RuntimeError as e:
            if "Study.stop" not in str(e):
                raise
            self.grid_done = True

    def _job_overrides(self, trial: optuna.Trial, study: optuna.Study, fixed: dict, url: Optional[str]) -> tuple:
        """A trial's job: its parameters and the fixed ones, and with a pruner the job's own trial in its environment
        (`hydra.job.env_set`, which every launcher applies in the job's process), for `OptunaPruning`."""
        params = tuple(f"{k}={v}" for k, v in {**trial.params, **fixed}.items())
        if self.pruner is None:
            return params
        import json

        from attnlab.callbacks.optuna_pruning import ENV_PRUNER, ENV_STORAGE, ENV_STUDY, ENV_TRIAL

        env = {ENV_STORAGE: url or "memory", ENV_STUDY: study.study_name, ENV_TRIAL: str(optuna_trial_id(trial)),
               ENV_PRUNER: json.dumps(self.pruner, separators=(",", ":"))}
        return params + tuple(f"++hydra.job.env_set.{k}='{v}'" for k, v in env.items())

    def _pruned(self, study: optuna.Study, trial: optuna.Trial, ret: Any, reason: Exception) -> None:
        """A trial its job stopped for the pruner: PRUNED in the study (its last reported value stands), a row of
        results.csv with its state and step."""
        self._record(study, trial, state=TrialState.PRUNED)
        frozen = stored_trial(study, trial)
        step = frozen.last_step
        value = frozen.intermediate_values.get(step) if step is not None else None
        log.info(f"Trial {trial.number} pruned at step {step} ({value}): {reason}")
        from attnlab.cli.training import append_row

        hc = ret.hydra_cfg.hydra if getattr(ret, "hydra_cfg", None) is not None else None
        row = {"job": trial.number, "overrides": " ".join(o for o in (ret.overrides or []) if "env_set" not in o),
               "metric": str(OmegaConf.select(self.config, "optimized_metric", default="") or ""),
               "value": value, "state": "pruned", "step": step,
               "run_dir": str(hc.runtime.output_dir) if hc is not None else str(getattr(ret, "working_dir", ""))}
        append_row(Path(self.config.hydra.sweep.dir) / "results.csv", row)

    def _tell(self, study: optuna.Study, trial: optuna.Trial, ret: Any) -> bool:
        """Report one job's return value; True where the job failed."""
        set_stored_attr(study, trial, "job_dir", str(getattr(ret, "working_dir", "") or ""))
        try:
            value = ret.return_value
            values = [float(value)] if len(self.directions) == 1 else [float(v) for v in value]
        except optuna.TrialPruned as e:
            self._pruned(study, trial, ret, e)
            return False
        except Exception as e:  # the job raised, or returned no number
            log.warning(f"Trial {trial.number} failed: {e}")
            self._record(study, trial, state=TrialState.FAIL)
            return True
        self._record(study, trial, values)
        return False

    def _save_results(self, study: optuna.Study, where: str) -> None:
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        results: dict[str, Any] = {"name": "optuna", "study_name": study.study_name, "storage": where,
                                   "n_trials_complete": len(complete)}
        if complete and len(self.directions) == 1:
            best = study.best_trial
            results |= {"best_params": best.params, "best_value": best.value, "best_trial": best.number}
            log.info(f"Best trial {best.number}: {best.params} -> {best.value}")
        elif complete:
            results["solutions"] = [{"params": t.params, "values": t.values} for t in study.best_trials]
        out = Path(self.config.hydra.sweep.dir)
        out.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(results), out / "optimization_results.yaml")


def _interrupted(study: optuna.Study, trial: Any, again: bool = True) -> None:
    """A trial whose process was stopped: failed, not counted, and (`again`) queued to run with its parameters."""
    set_stored_attr(study, trial, INTERRUPTED, True)
    study.tell(trial.number, state=TrialState.FAIL)
    if again:
        study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})


def _gpu_count() -> int:
    """CUDA devices of this machine, without initialising CUDA in the sweeper's process."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
