"""The ranks of an srun step agree on one run folder through rank 0's file named by the launch's own ids (job,
step, restart count, nodes), with no clock compared: a rank that starts minutes after rank 0 (a slow container or
conda start-up on its node) finds rank 0's folder, and a file left by another launch under the same name (a job
id the cluster gives out again) is never taken for it."""

from __future__ import annotations

import json

import pytest

from attnlab.errors import UserError
from attnlab.cluster import launch


def _step(monkeypatch, rank: int, restart: int = 0, nodes: str = "n[1-2]") -> launch.Launch:
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NAME": "train", "SLURM_CLUSTER_NAME": "c",
           "SLURM_RESTART_COUNT": str(restart), "SLURM_STEP_NODELIST": nodes, "SLURM_NODEID": str(rank),
           "SLURM_LOCALID": "0"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    found = launch.current_launch()
    assert found is not None and found.kind == "srun" and found.rank == rank
    return found


def test_a_late_rank_finds_rank_0s_folder_whatever_the_clocks(monkeypatch, tmp_path):
    runs = tmp_path / "runs"
    folder, _ = launch._through_file(_step(monkeypatch, 0), runs / "2026-11-28_10-00-00")
    marker = runs / ".launches" / "slurm-c-77.0.json"
    assert "started" not in json.loads(marker.read_text())  # no time in it: nothing to compare
    found, how = launch._through_file(_step(monkeypatch, 1), runs / "2026-11-28_10-05-00")  # 5 minutes later
    assert found == folder and "rank 0's" in how


@pytest.mark.parametrize("other", [{"restart": 1}, {"nodes": "n[3-4]"}])
def test_a_file_of_another_launch_under_the_same_name_is_not_taken(other, monkeypatch, tmp_path):
    runs = tmp_path / "runs"
    launch._through_file(_step(monkeypatch, 0), runs / "old")  # an earlier launch's file, never removed
    monkeypatch.setenv(launch.RANK_WAIT_ENV, "0.5")
    with pytest.raises(UserError, match="waited 0 s for rank 0 to name the run folder"):
        launch._through_file(_step(monkeypatch, 1, **other), runs / "new")
