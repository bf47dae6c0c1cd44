"""`launcher.timeout_min=auto` and `launcher.mem_gb=auto`: a job sized from what earlier jobs of the same config
measured on its partition (attnlab.utils.job_costs), else the partition's limit and SLURM's default memory."""

from __future__ import annotations

import math

from attnlab.utils.job_costs import MEM_MARGIN, MEM_SLACK_GB, TIME_MARGIN, TIME_SLACK_S, fingerprint, lookup, run_steps


def size(job, s, cfgs: list, variants: list[list[str]], config_name: str, cache_dir) -> None:
    """`launcher.timeout_min=auto` and `launcher.mem_gb=auto` from what earlier jobs of the same config measured on
    the job's partition (the largest over the sweep's variants; all of them must be known), else the partition's
    limit and SLURM's default memory; `job` (fit.Fit) is changed in place, with where each value came from."""
    from attnlab.cli.slurm.fit import AUTO, default_lead

    part = job.partition
    found = [lookup(cache_dir, part.name, fingerprint(config_name, v)) if cache_dir else None for v in variants]
    known = all(found) and bool(found)
    if s.timeout_min in (AUTO, None):
        steps = [run_steps(c.trainer, m) for c, m in zip(cfgs, found)] if known else []
        lead = None if s.signal_delay_s in (AUTO, None) else job.signal_delay_s  # the user's own: kept
        if known and all(n is not None for n in steps):
            minutes, m, n = max(((m.time_min(n, lead or TIME_SLACK_S), m, n) for m, n in zip(found, steps)),
                                key=lambda t: t[0])
            if lead is not None:  # SLURM's warning in the second half of the limit, as fit() requires of it
                minutes = max(minutes, math.ceil(2 * lead / 60))
            how = (f"estimated from job {m.job} on {part.name}: {m.startup_s:.0f} s start-up + {n} steps x "
                   f"{m.step_s:.2f} s, +{TIME_MARGIN - 1:.0%} and {TIME_SLACK_S / 60:.0f} min")
            if part.time_limit_min is not None and minutes > part.time_limit_min:
                minutes, how = part.time_limit_min, f"the partition's limit (the estimate, {minutes} min, is longer)"
            job.timeout_min, job.timeout_from = minutes, how
            job.signal_delay_s = default_lead(minutes) if lead is None else lead
        else:
            job.timeout_from = (f"the partition's limit: no earlier job of this config on {part.name} to estimate "
                                "from")
    if s.mem_gb == AUTO:
        if known:
            m = max(found, key=lambda m: m.peak_gb)
            job.mem_gb = min(m.mem_gb(), max(k.mem_mb for k in part.nodes) // 1024)
            job.mem_from = (f"peak {m.peak_gb:.1f} GB measured by job {m.job} on {part.name}, +"
                            f"{MEM_MARGIN - 1:.0%} and {MEM_SLACK_GB:.0f} GB")
        else:
            job.mem_from = f"SLURM's default: no earlier job of this config on {part.name} to estimate from"
