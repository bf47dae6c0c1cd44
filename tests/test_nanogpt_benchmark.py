"""`python benchmarks/gpt_shakespeare_cpu.py --nanogpt PATH`, the README's comparison with nanoGPT's own CPU recipe,
run against a stand-in checkout (no network here): the shared Tiny Shakespeare copied into its data folder before
its prepare.py, nanoGPT's README arguments passed to its train.py, whole runs alternated, and the medians of the
paired ratios printed from what each process logged."""

from __future__ import annotations

import re

import pytest

from conftest import DATA_DIR, real_data, run_cli

# nanoGPT's interface as the benchmark uses it: data/shakespeare_char/prepare.py reads input.txt beside it and writes
# train.bin; train.py takes a config file then --key=value overrides and logs "iter N: loss L, time Tms" and
# "step N: train loss A, val loss B".
PREPARE = """
from pathlib import Path
text = Path("input.txt").read_text()
Path("train.bin").write_bytes(text[:1000].encode())
"""
TRAIN = """
import sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[2:])
assert sys.argv[1] == "config/train_shakespeare_char.py" and args["device"] == "cpu" and args["n_embd"] == "128", args
open("args.log", "a").write(" ".join(sys.argv[1:]) + "\\n")
x = bytearray(128 << 20); x[::4096] = b"1" * len(x[::4096])  # a known peak RSS above the interpreter's
for i in range(int(args["max_iters"]) + 1):
    time.sleep(0.01)
    print(f"iter {i}: loss {3 - i / 100:.4f}, time 10.00ms, mfu 1.00%")
print(f"step {args['max_iters']}: train loss 2.5000, val loss 2.6000")
"""


@pytest.mark.slow
def test_the_nanogpt_comparison_alternates_whole_runs_and_prints_paired_ratios(tmp_path):
    real_data("tinyshakespeare")
    nano = tmp_path / "nanoGPT"
    (nano / "data" / "shakespeare_char").mkdir(parents=True)
    (nano / "config").mkdir()
    (nano / "config" / "train_shakespeare_char.py").write_text("")
    (nano / "data" / "shakespeare_char" / "prepare.py").write_text(PREPARE)
    (nano / "train.py").write_text(TRAIN)
    # the peaks its processes report are their own only when it runs as a real process (conftest.OWN_PEAK_LAUNCHER)
    out = run_cli("benchmarks/gpt_shakespeare_cpu.py", "--nanogpt", str(nano), "--pairs", "2", "--steps", "30",
                  own_peak_memory=True)
    assert out.returncode == 0, out.stdout[-3000:]
    shared = (DATA_DIR / "tinyshakespeare" / "input.txt").read_text()
    assert (nano / "data" / "shakespeare_char" / "input.txt").read_text() == shared
    assert (nano / "data" / "shakespeare_char" / "train.bin").read_bytes() == shared[:1000].encode()
    runs = (nano / "args.log").read_text().splitlines()
    assert len(runs) == 2 and all("--max_iters=30" in r and "--compile=False" in r for r in runs)
    assert len(re.findall(r"^pair \d: ", out.stdout, re.M)) == 2
    nanogpt = re.search(r"^nanoGPT +([\d.]+) +[-\d.]+ +([\d.]+) +([\d.]+)G +([\d.]+)", out.stdout, re.M)
    assert nanogpt and float(nanogpt[2]) == 10.0 and float(nanogpt[4]) == 2.6  # ms/iter and val loss as logged
    assert 0.12 < float(nanogpt[3]) < 0.5  # the stand-in's own peak RSS (128 MiB written), not the benchmark's
    for label in ("wall", "peak RSS", "ms/iteration"):
        ratio = re.search(rf"attnlab / nanoGPT {label}: ([\d.]+) \(median of 2 paired ratios\)", out.stdout)
        assert ratio and float(ratio[1]) > 0, out.stdout
