"""attnlab as an installed package: a wheel built from the source (no download) holds the configs, installs into a
fresh target, and its console scripts train and evaluate from a directory that has nothing of the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600, **kwargs)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}\n{out.stdout[-3000:]}"
    return out


@pytest.mark.slow
def test_the_wheel_installs_and_its_console_scripts_run_from_anywhere(tmp_path):
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "conf", source / "conf")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", source, "--no-build-isolation", "--no-deps", "-q",
          "-w", tmp_path / "dist"])
    (wheel,) = (tmp_path / "dist").glob("attnlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packaged = sorted("attnlab/" + p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml"))
    assert packaged and set(packaged) <= names, "configs missing from the wheel"
    assert {f"hydra_plugins/attnlab_optuna_sweeper/{m}.py" for m in ("optuna_sweeper", "_impl", "_search_space")} <= names
    assert "hydra_plugins/__init__.py" not in names  # Hydra's namespace package, shared with other plugins

    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site, wheel])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = os.environ | {"PYTHONPATH": str(site), "ATTNLAB_LOG_DIR": str(tmp_path / "logs"),
                        "ATTNLAB_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    where = _run([sys.executable, "-c", "import attnlab.config as c; print(c.CONF_DIR)"], cwd=elsewhere, env=env)
    assert Path(where.stdout.strip()) == site / "attnlab" / "conf"  # the installed copy, not the checkout

    short = ["trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
             "trainer.limit_test_batches=2", "extras.print_config=false", "callbacks.progress_bar=null"]
    _run([site / "bin" / "attnlab-train", *short], cwd=elsewhere, env=env)
    (last,) = (tmp_path / "logs").rglob("last.ckpt")
    out = _run([sys.executable, "-m", "attnlab.eval", f"ckpt_path={last}", "trainer.limit_test_batches=2",
                f"hydra.run.dir={tmp_path / 'eval'}"], cwd=elsewhere, env=env)
    assert "test/acc" in out.stdout and (tmp_path / "eval" / "metrics.json").is_file()
    assert sorted(p.name for p in elsewhere.iterdir()) == []  # logs and caches went where the environment said
