"""`launcher.timeout_min=auto` and `launcher.mem_gb=auto`: a job sized from what earlier jobs of the same key
measured on its partition, else the partition's limit and SLURM's default memory. Every kind of job a sweep runs must
be known; the longest time and the largest memory are asked for."""

from __future__ import annotations

import copy
import itertools
import math

from attnlab.lineage import code_record
from attnlab.utils.dotted import select
from attnlab.cluster.costs import (MEM_MARGIN, MEM_SLACK_GB, TIME_MARGIN, TIME_SLACK_S, code_version,
                                     costs, data_size, fingerprint, lookup, node_type,
                                     run_steps)

MAX_JOBS = 256  # kinds of job a sweep's sizing looks up, at most


def size(job, s, cfgs: list, overrides: list[str], cache_dir, code: str | None = None) -> None:
    """Size `job` (fit.Fit, changed in place, with where each value came from) for `launcher.timeout_min=auto` and
    `launcher.mem_gb=auto`, as the module says; the values the user gave (launcher.timeout_min, launcher.mem_gb,
    launcher.signal_delay_s) are kept. `cfgs`: the composed config of each line of the sweep, `overrides`: its
    command line."""
    from attnlab.cli.slurm.fit import AUTO, default_lead

    auto_time, auto_mem = s.timeout_min in (AUTO, None), s.mem_gb == AUTO
    if not (auto_time or auto_mem):
        return
    part = job.partition
    jobs, why = sweep_jobs(cfgs, overrides)
    found = []
    if cache_dir and jobs:
        code = code if code is not None else code_version(code_record())
        kinds, sizes = _kinds(job, s), {}  # the data's size once per data config (a folder's walk)
        for c in jobs:
            where = _text(c, "data") + _text(c, "paths")
            data = sizes[where] = sizes[where] if where in sizes else data_size(c)
            found += [(c, lookup(cache_dir, part.name, fingerprint(c, devices=job.devices, nodes=job.nodes,
                                                                   node=node_type(k), code=code, data=data)))
                      for k in kinds]
    known = bool(found) and all(m for _, m in found)
    missing = why or f"no earlier job of this config on {part.name} to estimate from"
    if auto_time:
        lead = None if s.signal_delay_s in (AUTO, None) else job.signal_delay_s  # the user's own: kept
        steps = [run_steps(c.trainer, m) for c, m in found] if known else []
        if known and all(n is not None for n in steps):
            minutes, m, n = max(((m.time_min(n, lead or TIME_SLACK_S), m, n) for (_, m), n in zip(found, steps)),
                                key=lambda t: t[0])
            if lead is not None:  # SLURM's warning in the second half of the limit, as fit() requires of it
                minutes = max(minutes, math.ceil(2 * lead / 60))
            ran_out = " (which ran out of time: its whole time over its steps)" if m.ran_out else ""
            how = (f"estimated from job {m.job} on {part.name}{ran_out}: {m.startup_s:.0f} s start-up + {n} steps x "
                   f"{m.step_s:.2f} s, +{TIME_MARGIN - 1:.0%} and {max(TIME_SLACK_S, lead or 0) / 60:.0f} min")
            if part.time_limit_min is not None and minutes > part.time_limit_min:
                minutes, how = part.time_limit_min, f"the partition's limit (the estimate, {minutes} min, is longer)"
            job.timeout_min, job.timeout_from = minutes, how
            job.signal_delay_s = default_lead(minutes) if lead is None else lead
        else:
            job.timeout_from = f"the partition's limit: {missing}"
    if auto_mem:
        if known:
            m = max((m for _, m in found), key=lambda m: m.peak_gb)
            job.mem_gb = min(m.mem_gb(), max(k.mem_mb for k in part.nodes) // 1024)
            job.mem_from = (f"peak {m.peak_gb:.1f} GB per node measured by job {m.job} on {part.name}"
                            f"{f' ({m.memory_from})' if m.memory_from else ''}, +{MEM_MARGIN - 1:.0%} and "
                            f"{MEM_SLACK_GB:.0f} GB")
        else:
            job.mem_from = f"SLURM's default: {missing}"


def _kinds(job, s) -> list:
    """The kinds of node of the job's partition that could run it (its GPUs, CPUs and memory per node)."""
    mem_mb = None if s.mem_gb in (None, "auto") else int(s.mem_gb) * 1024
    fit = [k for k in job.partition.nodes if k.runs(job.tasks_per_node * job.cpus_per_task, job.gpus_per_node, mem_mb)]
    return list({node_type(k): k for k in fit or job.partition.nodes}.values())


def sweep_jobs(cfgs: list, overrides: list[str]) -> tuple[list, str]:
    """(the composed config of each kind of job the sweep runs, as far as its cost goes, "") or ([], why not): each
    line's config with every value of the command line's swept keys and of the sweeper's params
    (`hydra.sweeper.params`) that change a step's cost, applied as Hydra applies a job's overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from attnlab.compat import apply_overrides

    cfgs = [c for c in cfgs if c is not None]
    if not cfgs:
        return [], "the sweep's config does not compose"
    params = select(cfgs[0], "hydra.sweeper.params") or {}
    parser = OverridesParser.create()
    try:
        given = parser.parse_overrides(list(overrides))
        searched = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    except Exception:
        return [], "the sweep's command line does not parse"
    swept: list[tuple[str, list[str]]] = []
    for o, from_line in [*((o, True) for o in given), *((o, False) for o in searched)]:
        key = o.key_or_group
        if not o.is_sweep_override() or not costs(key) or (from_line and "." not in key):
            continue  # a group swept on the command line: a line of its own (_variants)
        if "." not in key and isinstance(select(cfgs[0], key), dict):
            return [], f"the sweeper chooses the group {key}, whose jobs are not composed here"
        try:
            values = list(o.sweep_string_iterator())
        except Exception:
            return [], f"{key} is searched over a range ({o.input_line}) that has no list of values"
        swept.append((f"++{key}" if o.is_add() else key, values))
    count = len(cfgs) * math.prod(len(v) for _, v in swept)
    if count > MAX_JOBS:
        return [], f"the sweep runs {count} kinds of job, more than the {MAX_JOBS} looked up"
    if not swept:
        return cfgs, ""
    jobs = []
    for cfg in cfgs:
        for values in itertools.product(*(v for _, v in swept)):
            one = copy.deepcopy(cfg)
            try:
                lines = parser.parse_overrides([f"{k}={v}" for (k, _), v in zip(swept, values)])
                apply_overrides(one, lines)
            except Exception:  # Hydra's run says why this job does not compose
                return [], "a job of the sweep does not compose"
            jobs.append(one)
    return jobs, ""


def _text(cfg, key: str) -> str:
    from omegaconf import OmegaConf

    node = cfg.get(key)
    return OmegaConf.to_yaml(node) if OmegaConf.is_config(node) else repr(node)
