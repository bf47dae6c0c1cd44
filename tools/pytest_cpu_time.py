"""Where the test suite's CPU time goes: a pytest plugin, and a report of what it recorded.

On two cores the suite is bound by CPU (its cores are busy ~99% of a run), so its length is its CPU time over two.
At each test's start and end the plugin records the CPU time (user + system, children reaped included) of the test
process and every process under it (the tests' fork server, the runs it starts, DDP ranks, torchrun agents), and the
CPU time of the whole machine. Processes that are not under a worker (the SLURM cluster's jobs, started by its
daemons) show in the machine's time only: the report counts, over each test of the worker whose tests wait on the
cluster, the machine's time less the workers' own.

    PYTHONPATH=tools make test PYTEST_ARGS="-p pytest_cpu_time"    # a JSON line a test, in
                                                                    # $ATTNLAB_CPU_TIME_OUT.<worker>.jsonl
    python tools/pytest_cpu_time.py /tmp/attnlab-cpu-time.gw*.jsonl  # totals, then the costliest tests
"""

from __future__ import annotations

import json
import os
import sys
import time

_TICK = os.sysconf("SC_CLK_TCK")
_started: dict[str, tuple[float, float, float]] = {}
_recording = {"on": True, "worker": "main"}


def _tree_seconds(root: int) -> float:
    """CPU seconds of `root` and every process under it, each with the children it has reaped."""
    parent, seconds = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        parent[int(name)] = int(fields[1])
        seconds[int(name)] = sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += seconds.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def _machine_seconds() -> float:
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK  # all but idle and iowait


def pytest_configure(config):
    # pytest-xdist's controller hears of every worker's tests, with all the workers under it: they record their own
    _recording["on"] = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
    _recording["worker"] = getattr(config, "workerinput", {}).get("workerid", "main")


def pytest_runtest_logstart(nodeid, location):
    if _recording["on"]:
        _started[nodeid] = (time.time(), _tree_seconds(os.getpid()), _machine_seconds())


def pytest_runtest_logfinish(nodeid, location):
    if nodeid not in _started:
        return
    t0, own0, machine0 = _started.pop(nodeid)
    worker = _recording["worker"]
    with open(f"{os.environ.get('ATTNLAB_CPU_TIME_OUT', '/tmp/attnlab-cpu-time')}.{worker}.jsonl", "a") as f:
        f.write(json.dumps({"test": nodeid, "worker": worker, "start": t0, "wall": time.time() - t0,
                            "cpu": _tree_seconds(os.getpid()) - own0, "machine": _machine_seconds() - machine0})
                + "\n")


def report(rows: list[dict], top: int = 30) -> str:
    """Totals per worker, the cluster's share, and the `top` tests by CPU time (their own, plus the cluster's)."""
    if not rows:
        return "no tests recorded"
    cluster_worker = max({r["worker"] for r in rows}, key=lambda w: sum("slurm_cluster" in r["test"] for r in rows
                                                                        if r["worker"] == w))
    others = [r for r in rows if r["worker"] != cluster_worker]

    def others_during(a: float, b: float) -> float:  # the other workers' CPU time within [a, b], spread evenly
        return sum(r["cpu"] * (min(b, r["start"] + r["wall"]) - max(a, r["start"])) / r["wall"] for r in others
                   if r["wall"] > 0 and min(b, r["start"] + r["wall"]) > max(a, r["start"]))

    cost = {}
    for r in rows:
        outside = 0.0
        if r["worker"] == cluster_worker and "slurm_cluster" in r["test"]:
            outside = max(0.0, r["machine"] - r["cpu"] - others_during(r["start"], r["start"] + r["wall"]))
        cost[r["test"]] = (r["cpu"], outside, r["wall"])
    span = max(r["start"] + r["wall"] for r in rows) - min(r["start"] for r in rows)
    lines = [f"{len(rows)} tests in {span:.0f} s; CPU seconds: {sum(c for c, _, _ in cost.values()):.0f} in the "
             f"workers' tests, {sum(o for _, o, _ in cost.values()):.0f} in the cluster's jobs"]
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        lines.append(f"  {worker}: {len(mine)} tests, {sum(r['wall'] for r in mine):.0f} s, "
                     f"{sum(r['cpu'] for r in mine):.0f} CPU s")
    lines.append("   CPU s  cluster  wall s  test")
    for test, (cpu, outside, wall) in sorted(cost.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:top]:
        lines.append(f"  {cpu:6.1f}  {outside:7.1f}  {wall:6.1f}  {test}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report([json.loads(line) for path in sys.argv[1:] for line in open(path) if line.strip()]))
