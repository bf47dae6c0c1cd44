"""nanoGPT's CPU recipe on Tiny Shakespeare: attnlab's `train.py experiment=gpt_shakespeare_char_cpu` against a bare
PyTorch loop of the same model on the same batches (same data module, seed, optimizer groups and schedule).

    OMP_NUM_THREADS=1 python benchmarks/gpt_shakespeare_cpu.py [--steps 2000]

Prints ms/iteration, tokens/s, peak RSS and final val loss of each, and the throughput ratio ours / bare.
A third row, "torch only", is nanoGPT's train.py structure (char ids in a numpy array, random windows, no Lightning
import) with the same model: it separates what the training costs in memory from what importing Lightning costs.
Peak RSS is the process's own (os.wait4), as /usr/bin/time reports it; "before exit" is the peak before the
interpreter shuts down (CPython's teardown with torch loaded pages in about 0.1 GB of torch's library code).
Reference (nanoGPT, 2 cores): val loss 1.8857 at 2000 iterations, 65 ms/iteration, peak RSS 0.86 GB.

    python benchmarks/gpt_shakespeare_cpu.py --nanogpt /tmp/nanoGPT --pairs 5

runs nanoGPT's own README CPU recipe (its train.py, in a nanoGPT checkout given by path: the shared Tiny Shakespeare
is copied into its data folder before its prepare.py) and attnlab's whole `train.py
experiment=gpt_shakespeare_char_cpu` as a user runs it, alternately, at the same thread count, and prints each
pair's wall time, peak RSS (each process's own ru_maxrss), steady ms/iteration, start-up (wall minus the steady
steps) and val loss, with the median of the paired ratios attnlab / nanoGPT.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnlab.utils.atomic import scratch_folder

ROOT = Path(__file__).resolve().parents[1]
BLOCK, BATCH, EVAL_EVERY, EVAL_BATCHES = 64, 12, 250, 20


def run_ours(steps: int, out: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=gpt_shakespeare_char_cpu", f"trainer.max_steps={steps}",
           f"trainer.val_check_interval={min(EVAL_EVERY, steps)}", "logger=csv", "test=false",
           "callbacks.progress_bar=null", "extras.print_config=false",
           f"hydra.run.dir={out}", f"paths.cache_dir={out.parent / 'cache'}"]
    cmd[1:2] = ["-c", _REPORT_AT_EXIT + "import runpy; runpy.run_path(sys.argv[0], run_name='__main__')", cmd[1]]
    wall, output, rss = run_train(cmd, out.parent / "ours.log")
    rows = list(csv.DictReader(open(out / "csv" / "metrics.csv")))
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    return {"tokens_per_s": steady_tokens_per_s(out), "val_loss": val[-1], "wall_s": wall, "peak_rss_gb": rss,
            "before_exit_gb": before_exit(output)}


def run_train(cmd: list[str], log: Path) -> tuple[float, str, float]:
    """(wall seconds, output, peak RSS in GB) of a train.py process; its output ends the benchmark if it fails."""
    start = time.perf_counter()
    code, output, rss = run_measured(cmd, log)
    if code:
        sys.exit(output[-3000:])
    return time.perf_counter() - start, output, rss


def steady_tokens_per_s(run_dir: Path) -> float:
    """The median of a run's logged tokens/s, the first tenth of its windows (warm-up) left out."""
    rows = list(csv.DictReader(open(run_dir / "csv" / "metrics.csv")))
    tps = [float(r["perf/tokens_per_s"]) for r in rows if r.get("perf/tokens_per_s")]
    return statistics.median(tps[len(tps) // 10:] or tps)


def bare(steps: int, cache: str) -> None:
    """The same model, data and optimization in a plain loop (runs in its own process; prints JSON)."""
    from attnlab.data.text.corpus import TextDataModule

    dm = TextDataModule(name="tinyshakespeare", files=[os.environ["ATTNLAB_DATA_DIR"] + "/tinyshakespeare/input.txt"],
                        block_size=BLOCK, batch_size=BATCH, seed=1337, cache_dir=cache)
    dm.prepare_data()
    dm.setup("fit")

    def train_batches():
        while True:
            yield from dm.train_dataloader()

    train_loop(steps, dm.info().vocab_size, train_batches(), lambda: dm.val_dataloader())


def torch_only(steps: int) -> None:
    """nanoGPT's loop: the corpus as char ids in memory, random windows per batch, nothing but torch and numpy."""
    import numpy as np
    import torch

    text = open(os.environ["ATTNLAB_DATA_DIR"] + "/tinyshakespeare/input.txt", encoding="utf-8").read()
    chars = sorted(set(text))
    lut = np.zeros(max(map(ord, chars)) + 1, dtype=np.uint16)
    lut[[ord(c) for c in chars]] = np.arange(len(chars))
    ids = lut[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]
    n = int(0.9 * len(ids))

    def batches(data: np.ndarray):
        while True:
            ix = torch.randint(len(data) - BLOCK, (BATCH,)).tolist()
            x = torch.stack([torch.from_numpy(data[i:i + BLOCK].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + BLOCK].astype(np.int64)) for i in ix])
            yield x, y

    train_loop(steps, len(chars), batches(ids[:n]), lambda: batches(ids[n:]))


def train_loop(steps: int, vocab_size: int, train_batches, val_batches) -> None:
    """Train the recipe's model on `train_batches` (an endless iterator of (x, y)), validating on EVAL_BATCHES of
    `val_batches()` every EVAL_EVERY steps; prints ms/iteration, tokens/s and the last val loss as JSON."""
    import torch

    from attnlab.nn.gpt import GPT, GPTConfig
    from attnlab.optim.param_groups import param_groups
    from attnlab.optim.schedulers import cosine

    torch.manual_seed(1337)
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=BLOCK, n_layer=4, n_head=4, n_embd=128))
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
    sched = cosine(opt, steps, warmup=100, min_lr_ratio=0.1)["scheduler"]
    times, val = [], float("nan")
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        x, y = next(train_batches)
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        if step % EVAL_EVERY == 0 or step == steps:
            model.eval()
            with torch.no_grad():
                losses = [model.loss(x, y).item() for _, (x, y) in zip(range(EVAL_BATCHES), val_batches())]
            model.train()
            val = sum(losses) / len(losses)
    times = times[len(times) // 10:]
    print(json.dumps({"ms_per_iter": 1000 * statistics.median(times), "val_loss": val,
                      "tokens_per_s": BLOCK * BATCH / statistics.median(times)}))


def run_script_mode(mode: str, steps: int, cache: Path) -> dict:
    """Run this file in `mode` (bare / torch-only) in its own process; -> its JSON result + wall time and memory."""
    start = time.perf_counter()
    cmd = [sys.executable, "-c", _REPORT_AT_EXIT + "import runpy; runpy.run_path(sys.argv[0], run_name='__main__')",
           __file__, f"--{mode}", "--steps", str(steps), "--cache", str(cache)]
    code, output, rss = run_measured(cmd, cache.parent / f"{mode}.log")
    if code:
        sys.exit(output[-3000:])
    result = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    return result | {"wall_s": time.perf_counter() - start, "peak_rss_gb": rss, "before_exit_gb": before_exit(output)}


# Prepended to each measured process: prints its peak RSS when the interpreter starts shutting down.
_REPORT_AT_EXIT = ("import atexit, resource, sys; sys.argv = sys.argv[1:]; "
                   "atexit.register(lambda: print(f'peak RSS before exit: {resource.getrusage(resource.RUSAGE_SELF)"
                   ".ru_maxrss / 1e6:.3f}', flush=True)); ")


def before_exit(output: str) -> float:
    lines = [line for line in output.splitlines() if line.startswith("peak RSS before exit:")]
    return float(lines[-1].split(":")[1]) if lines else float("nan")


def run_measured(cmd: list[str], log: Path, cwd: Path = ROOT) -> tuple[int, str, float]:
    """Run cmd (output to `log`); -> (exit code, output, the process's own peak RSS in GB)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, log.read_text(), usage.ru_maxrss / 1e6


# ---- against nanoGPT itself, whole processes, alternated

def nanogpt_args(steps: int) -> list[str]:
    return ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
            "--log_interval=1", f"--block_size={BLOCK}", f"--batch_size={BATCH}", "--n_layer=4", "--n_head=4",
            "--n_embd=128", f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--dropout=0.0"]


def prepare_nanogpt(path: Path) -> None:
    data = path / "data" / "shakespeare_char"
    if not (data / "input.txt").is_file():
        shutil.copy(Path(os.environ["ATTNLAB_DATA_DIR"]) / "tinyshakespeare" / "input.txt", data / "input.txt")
    if not (data / "train.bin").is_file():
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, stdout=subprocess.DEVNULL)


def run_nanogpt(path: Path, steps: int, log: Path) -> dict:
    start = time.perf_counter()
    code, output, rss = run_measured([sys.executable, "train.py", *nanogpt_args(steps)], log, cwd=path)
    wall = time.perf_counter() - start
    if code:
        sys.exit(output[-3000:])
    ms = [float(m) for m in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", output, re.M)]
    val = [float(v) for v in re.findall(r"^step \d+: train loss [\d.]+, val loss ([\d.]+)", output, re.M)]
    ms = statistics.median(ms[len(ms) // 10:])
    return {"wall_s": wall, "peak_rss_gb": rss, "ms_per_iter": ms, "val_loss": val[-1],
            "startup_s": wall - steps * ms / 1000}


def run_attnlab_whole(steps: int, out: Path) -> dict:
    """train.py as a user runs the recipe (its own checkpoints, logs and validation), the token cache warm."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(ROOT / "train.py"), "experiment=gpt_shakespeare_char_cpu", f"trainer.max_steps={steps}",
           f"hydra.run.dir={out}", f"paths.cache_dir={out.parent / 'cache'}"]
    wall, _, rss = run_train(cmd, out.parent / "attnlab_whole.log")
    ms = 1000 * BLOCK * BATCH / steady_tokens_per_s(out)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": wall, "peak_rss_gb": rss, "ms_per_iter": ms, "val_loss": metrics.get("val/loss", float("nan")),
            "startup_s": wall - steps * ms / 1000}


def against_nanogpt(path: Path, steps: int, pairs: int) -> None:
    prepare_nanogpt(path)
    work = scratch_folder("attnlab_vs_nanogpt_")
    run_attnlab_whole(min(steps, 20), work / "warm")  # tokenizes into the cache once (nanoGPT's prepare.py did)
    rows = []
    for i in range(pairs):
        first, second = ("nanoGPT", "attnlab") if i % 2 == 0 else ("attnlab", "nanoGPT")
        pair = {}
        for name in (first, second):
            pair[name] = (run_nanogpt(path, steps, work / f"nanogpt_{i}.log") if name == "nanoGPT"
                          else run_attnlab_whole(steps, work / "run"))
        rows.append(pair)
        print(f"pair {i + 1}: " + "; ".join(f"{n} wall {r['wall_s']:.1f} s, RSS {r['peak_rss_gb']:.2f} GB, "
                                            f"{r['ms_per_iter']:.1f} ms/iter, val {r['val_loss']:.4f}"
                                            for n, r in pair.items()), flush=True)
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, steps: {steps}, pairs: {pairs}")
    print(f"{'':8} {'wall s':>7} {'start-up s':>10} {'ms/iter':>8} {'peak RSS':>9} {'val loss':>9}  (medians)")
    for name in ("nanoGPT", "attnlab"):
        med = {k: statistics.median(r[name][k] for r in rows) for k in rows[0][name]}
        print(f"{name:8} {med['wall_s']:7.1f} {med['startup_s']:10.1f} {med['ms_per_iter']:8.1f} "
              f"{med['peak_rss_gb']:8.2f}G {med['val_loss']:9.4f}")
    for key, label in (("wall_s", "wall"), ("peak_rss_gb", "peak RSS"), ("ms_per_iter", "ms/iteration")):
        ratio = statistics.median(r["attnlab"][key] / r["nanoGPT"][key] for r in rows)
        print(f"attnlab / nanoGPT {label}: {ratio:.3f} (median of {pairs} paired ratios)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout: alternate whole runs against it")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("ATTNLAB_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    if args.bare:
        return bare(args.steps, args.cache)
    if args.torch_only:
        return torch_only(args.steps)
    if args.nanogpt:
        return against_nanogpt(args.nanogpt.resolve(), args.steps, args.pairs)
    work = scratch_folder("attnlab_bench_")
    bare_r = run_script_mode("bare", args.steps, work / "cache")   # first: it also tokenizes the corpus into the cache
    ours = run_ours(args.steps, work / "run")
    torch_r = run_script_mode("torch-only", args.steps, work / "cache")
    ours["ms_per_iter"] = 1000 * BLOCK * BATCH / ours["tokens_per_s"]
    print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, steps: {args.steps}")
    print(f"{'':10} {'ms/iter':>8} {'tokens/s':>9} {'peak RSS':>9} {'before exit':>12} {'val loss':>9} {'wall':>7}")
    for name, r in (("attnlab", ours), ("bare", bare_r), ("torch only", torch_r)):
        print(f"{name:10} {r['ms_per_iter']:8.1f} {r['tokens_per_s']:9.0f} {r['peak_rss_gb']:8.2f}G "
              f"{r['before_exit_gb']:11.2f}G {r['val_loss']:9.4f} {r['wall_s']:6.0f}s")
    print(f"throughput ours / bare: {ours['tokens_per_s'] / bare_r['tokens_per_s']:.2f}")
    print("nanoGPT reference: val loss 1.8857 at 2000 iterations, 65 ms/iteration, peak RSS 0.86 GB")


if __name__ == "__main__":
    main()
