"""How close the memory estimate that train.py logs at start ("memory: about X GiB per process ...") comes to the peak
the run reaches: each config trains in its own process, and the peak is that process's own `ru_maxrss`.

    python benchmarks/memory_estimate.py [--steps N] [--only NAME ...] [overrides for every run ...]

Exits with status 1 when an estimate is off by more than 30% of the peak. Reads the datasets from
$ATTNLAB_DATA_DIR (default: ../shared/data).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "gpt_cpu_recipe": ["experiment=gpt_shakespeare_char_cpu"],  # nanoGPT's CPU recipe
    "vit_default": [],                                            # train.py's defaults: model=vit data=digits
    "unet_membrane": ["experiment=unet_membrane"],
}
ESTIMATE = re.compile(r"memory: about ([\d.]+) GiB per process on \w+ \(([^)]*)\)")
PEAK = re.compile(r"peak memory \(CPU\) +([\d.]+) GiB")  # train.py's report: its own ru_maxrss


def run(name: str, overrides: list[str], out: Path) -> tuple[float, float, str]:
    """(estimate GiB, peak GiB, the estimate's terms) of one run of train.py."""
    env = os.environ | {"ATTNLAB_DATA_DIR": os.environ.get("ATTNLAB_DATA_DIR", str(ROOT.parent / "shared" / "data")),
                        "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, str(ROOT / "train.py"), *CONFIGS[name], *overrides, "logger=null",
            "extras.print_config=false", "callbacks.progress_bar=null", f"hydra.run.dir={out / name}"]
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.run(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    text = (out / f"{name}.log").read_text()
    found, peak = ESTIMATE.search(text), PEAK.search(text)
    if code != 0 or not found or not peak:
        sys.exit(f"{name}: train.py failed (exit {code}) or logged no estimate or peak:\n{text[-3000:]}")
    return float(found.group(1)), float(peak.group(1)), found.group(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="training steps of each run")
    p.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="run these configs only")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. trainer.limit_val_batches=2")
    args = p.parse_intermixed_args()
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or CONFIGS:
            est, peak, terms = run(name, [f"trainer.max_steps={args.steps}", "trainer.max_epochs=-1",
                                          *args.overrides], Path(tmp))
            error = est / peak - 1
            worst = max(worst, abs(error))
            rows.append(f"| {name} | {est:.2f} GiB | {peak:.2f} GiB | {100 * error:+.0f}% | {terms} |")
    print("\n| config | estimate | peak (ru_maxrss) | error | estimate's terms (GiB) |")
    print("|---|---:|---:|---:|---|")
    print("\n".join(rows))
    if worst > 0.30:
        sys.exit(f"an estimate is off by {100 * worst:.0f}% of its run's peak (more than 30%)")


if __name__ == "__main__":
    main()
