"""What `launcher=slurm` adds before training starts: the time from the command to the first training step, through
`python train.py -m launcher=slurm ...` (the fit to the partition, `sbatch --test-only`, submitit's submission, the
job's start-up) against `sbatch` of a batch script with `srun python train.py ...` for the same run, alternated.

    python benchmarks/slurm_overhead.py --pairs 3 [--partition debug] [key=value ...]

Each run gets a callback that writes the wall time of its first training step's end; the command's own start is
the reference. Prints each pair, the medians and attnlab's seconds over the bare path (goal: at most 10 s).
Needs a SLURM cluster (tools/slurm-cluster.sh start) and a filesystem the nodes share with this machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnlab.utils.atomic import scratch_folder

ROOT = Path(__file__).resolve().parents[1]
RUN = ["trainer=cpu", "trainer.max_steps=3", "trainer.limit_val_batches=1", "test=false", "data.num_workers=0",
       "callbacks.progress_bar=null", "extras.print_config=false"]
FIRST_STEP = '''
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class FirstStep(Callback):
    def __init__(self, path: str):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not Path(self.path).exists():
            Path(self.path).write_text(repr(time.time()))
'''


def until_file(path: Path, started: float, timeout: float = 600) -> float:
    """Seconds from `started` (time.time()) to the time written in `path`."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"no first training step within {timeout} s ({path})")
        time.sleep(0.1)
    time.sleep(0.1)
    return float(path.read_text()) - started


def launcher_slurm(work: Path, n: int, partition: str, extra: list[str], env: dict) -> float:
    mark = work / f"launcher_{n}.time"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "launcher=slurm", f"launcher.partition={partition}", *RUN,
           *extra, "+callbacks.first_step._target_=first_step.FirstStep", f"+callbacks.first_step.path={mark}",
           f"hydra.sweep.dir={work / f'sweep_{n}'}"]
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    took = until_file(mark, started)
    if proc.wait(timeout=600) != 0:
        sys.exit(f"launcher=slurm run {n} failed: {' '.join(cmd)}")
    return took


def sbatch_srun(work: Path, n: int, partition: str, extra: list[str], env: dict) -> float:
    mark = work / f"sbatch_{n}.time"
    run = shlex.join(["srun", sys.executable, str(ROOT / "train.py"), *RUN, *extra,
                      "+callbacks.first_step._target_=first_step.FirstStep", f"+callbacks.first_step.path={mark}",
                      f"hydra.run.dir={work / f'run_{n}'}"])
    started = time.time()
    job = subprocess.run(["sbatch", "--parsable", "-p", partition, "-n", "1", "-c", "1", "-o",
                          str(work / f"sbatch_{n}.log"), "--wrap", run], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    took = until_file(mark, started)
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.5)
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--partition", default="debug")
    p.add_argument("overrides", nargs="*", help="key=value overrides of both runs")
    args = p.parse_args()
    work = scratch_folder("attnlab-slurm-overhead-")
    (work / "first_step.py").write_text(FIRST_STEP)
    env = os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_LOG_DIR": str(work / "logs"),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))}
    rows = []
    for n in range(args.pairs):
        bare = sbatch_srun(work, n, args.partition, args.overrides, env)
        ours = launcher_slurm(work, n, args.partition, args.overrides, env)
        rows.append((bare, ours))
        print(f"pair {n + 1}: sbatch + srun {bare:.1f} s, launcher=slurm {ours:.1f} s (+{ours - bare:.1f} s)",
              flush=True)
    bare, ours = (statistics.median(r[i] for r in rows) for i in (0, 1))
    print(f"median to the first training step: sbatch + srun {bare:.1f} s, launcher=slurm {ours:.1f} s, "
          f"+{ours - bare:.1f} s (goal: at most +10 s)")


if __name__ == "__main__":
    main()
