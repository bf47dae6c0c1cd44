"""tests/prefork.py: a forked child runs a script as `python` runs it (what the entry-point tests rely on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import prefork
from conftest import FAST, ROOT, compose_cfg, run_cli

SCRIPT = textwrap.dedent("""
    import os, sys
    print(__name__, sys.argv[1:], os.getcwd(), os.environ.get("PREFORK_PROBE"), sys.path[0] == os.path.dirname(__file__))
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "fail":
        raise ValueError("a bug")
    if sys.argv[1] == "sleep":
        import time; time.sleep(60)
    sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
""")


def test_a_forked_script_behaves_as_a_new_python_process(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = {**prefork.server().env, "PREFORK_PROBE": "seen"}
    for arg in ("0", "3", "fail", "a message"):
        runs = [impl.run([sys.executable, str(script), arg], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60) for impl in (prefork, subprocess)]
        forked, real = runs
        assert forked.returncode == real.returncode and forked.stdout == real.stdout, (arg, forked, real)
        assert forked.stderr.splitlines()[0] == real.stderr.splitlines()[0] == "to stderr"
        assert forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1], (forked.stderr, real.stderr)
    assert forked.stdout == f"__main__ ['a message'] {tmp_path} seen True\n"


def test_a_forked_process_is_its_own_to_signal_and_an_import_time_variable_forces_a_real_one(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    proc = prefork.Popen([sys.executable, str(script), "sleep"], cwd=tmp_path, env=prefork.server().env,
                         stdout=subprocess.DEVNULL)
    assert isinstance(proc, prefork.Forked) and proc.poll() is None
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    other = prefork.Popen([sys.executable, str(script), "0"], env={**prefork.server().env, "OMP_NUM_THREADS": "7"},
                          stdout=subprocess.DEVNULL)
    assert isinstance(other, subprocess.Popen) and other.wait(timeout=60) == 0


PATH_PROBE = "import sys, usermod; print(usermod.NAME, sys.path[1:])"


def test_a_pythonpath_of_the_commands_own_is_its_sys_path_unless_it_shadows_what_the_server_imported(tmp_path):
    """A command with a PYTHONPATH of its own (a user's callback module beside the test) is forked, with the sys.path
    a new process gets from it; one whose PYTHONPATH would import a module the server has already imported in place
    of it (a wheel's site folder with attnlab in it), or holds a module a new interpreter runs as it starts
    (sitecustomize), runs as a real process."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "usermod.py").write_text("NAME = 'user'")
    (tmp_path / "probe.py").write_text(PATH_PROBE)
    env = {**prefork.server().env, "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), "", "rel"])}
    proc = prefork.Popen([sys.executable, str(tmp_path / "probe.py")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    assert isinstance(proc, prefork.Forked)
    forked = proc.communicate(timeout=60)[0]
    real = subprocess.run([sys.executable, str(tmp_path / "probe.py")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert forked == real.stdout and forked.startswith(f"user ['{tmp_path / 'mods'}', '{tmp_path}', "), (forked, real)
    (tmp_path / "site" / "attnlab").mkdir(parents=True)
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text("")
    for folder in ("site", "hook"):
        shadowing = prefork.Popen([sys.executable, str(tmp_path / "probe.py")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                  env={**env, "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), folder])})
        assert isinstance(shadowing, subprocess.Popen) and shadowing.wait(timeout=60) == 0, folder


def test_the_entry_points_are_forked_after_a_training_in_the_test_process(tmp_path):
    """Lightning and torch set variables of their own while a test trains in-process (PL_GLOBAL_SEED, KMP_*, ...):
    they must not make every later command a real process."""
    from attnlab.cli.training import train

    train(compose_cfg(["trainer.fast_dev_run=true", *FAST], tmp_path))
    env = os.environ | {"PYTHONUNBUFFERED": "1", "ATTNLAB_DATA_DIR": str(tmp_path)}
    proc = prefork.Popen([sys.executable, str(ROOT / "train.py"), "--help"], env=env, stdout=subprocess.DEVNULL)
    assert isinstance(proc, prefork.Forked), sorted(k for k in env if env[k] != prefork.server().env.get(k))
    assert proc.wait(timeout=60) == 0


SERVER_OWN = "import json, os, random, runpy, signal, socket, sys, threading; print('\\n'.join(sys.modules))"


def test_a_forked_run_and_a_new_process_end_with_the_same_modules_and_the_same_run_folder(tmp_path, small_data):
    """A run forked from the server and the same command as a new `python` process end with the same imported modules (but those the server
    imports for its own work: sockets, runpy) and write the same files in their run folders."""
    args = ["trainer.max_steps=2", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", "data.num_workers=0"]
    runs = {}
    for how in ("forked", "new"):
        modules = tmp_path / f"{how}.modules"
        env = {"ATTNLAB_RECORD_MODULES": str(modules), "ATTNLAB_LOG_DIR": str(tmp_path / how)}
        if how == "new":
            env["ATTNLAB_TEST_PREFORK"] = "0"
        else:
            prefork.server()  # started before the command, as in the suite
        out = run_cli("train.py", *args, env=env, data_dir=small_data, timeout=300)
        assert out.returncode == 0, out.stdout[-3000:]
        run_dir = next((tmp_path / how).rglob("metrics.json")).parent
        files = {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}
        runs[how] = (set(modules.read_text().split()), files)
    server_own = set(subprocess.run([sys.executable, "-c", SERVER_OWN], capture_output=True, text=True).stdout.split())
    plain = set(subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.modules))"],
                               capture_output=True, text=True).stdout.split())
    (forked, forked_files), (new, new_files) = runs["forked"], runs["new"]
    assert "torchmetrics" in new and "lightning.pytorch" in new
    assert forked - new <= server_own - plain, sorted(forked - new - (server_own - plain))
    assert new - forked <= set(), sorted(new - forked)
    assert forked_files == new_files, sorted(forked_files ^ new_files)
