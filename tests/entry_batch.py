"""Many entry-point commands in one process, each as its script would run it: `python tests/entry_batch.py <cases.json>
<report.json>`. A case is {"name", "script" (train.py, eval.py, predict.py, export.py, or compare), "args", "cwd"};
its report {"code": the exit status, "output": its stdout and stderr}, an exception that escapes the entry point
reported as a Python traceback and status 1, as the interpreter would print it. One process saves each command
the ~10 s of importing torch and Lightning, so a test can give every hostile file to every entry point."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

MAINS = {"train.py": "attnlab.cli.train", "eval.py": "attnlab.cli.eval", "predict.py": "attnlab.cli.predict",
         "export.py": "attnlab.cli.export", "compare": "attnlab.compare.cli"}


def _reset() -> None:
    """What one command leaves behind for the next in the process: Hydra's global state, a rerun's run folder, the
    handlers of the log files."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    import attnlab.cli.rerun as rerun

    rerun._request, rerun._run_dir, rerun._asked, rerun._given = None, None, [], None
    from attnlab.checkpoints import trust

    trust.reset()
    for logger in (logging.getLogger(), logging.getLogger("attnlab")):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()


def run(case: dict) -> dict:
    import importlib

    module = importlib.import_module(MAINS[case["script"]])
    out = io.StringIO()
    env = dict(os.environ)
    os.environ.update(case.get("env") or {})
    cwd = os.getcwd()
    os.chdir(case.get("cwd") or cwd)
    sys.argv = [case["script"], *case["args"]]
    code, start = 0, time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                result = module.main()
                code = result if isinstance(result, int) and case["script"] == "compare" else 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                print("Traceback (most recent call last):\n" + "".join(traceback.format_exc().splitlines(True)[1:]),
                      file=sys.stderr)
                code = 1
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        _reset()
    return {"code": code, "output": out.getvalue(), "seconds": round(time.perf_counter() - start, 2)}


def run_here(case: dict) -> dict:
    """`run(case)` in a test's own process, its logging handlers (pytest's) and level kept."""
    kept = {lg: list(lg.handlers) for lg in (logging.getLogger(), logging.getLogger("attnlab"))}
    level = logging.getLogger().level
    try:
        return run(case)
    finally:
        for lg, handlers in kept.items():
            for h in handlers:
                if h not in lg.handlers:
                    lg.addHandler(h)
        logging.getLogger().setLevel(level)


if __name__ == "__main__":
    cases_file, report_file = map(Path, sys.argv[1:3])
    cases = json.loads(cases_file.read_text())
    import lightning  # noqa: F401  (once, for every case)
    report = {}
    for case in cases:
        report[case["name"]] = run(case)
        report_file.write_text(json.dumps(report))  # what ran so far, should a case hang
