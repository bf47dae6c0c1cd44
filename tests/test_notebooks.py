"""The notebooks in notebooks/ run top to bottom (each in well under a minute on a CPU), and are committed
without outputs. They train on the real datasets (ATTNLAB_DATA_DIR): a notebook whose dataset is missing is skipped
with a line naming it."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT, DATA_DIR, real_data

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# the datasets under ATTNLAB_DATA_DIR each notebook reads (scikit-learn's digits need none)
DATASETS = {"quickstart": [], "attention_maps": ["multi30k"], "generation": ["tinyshakespeare"]}
# shorter training for the tests, set after a notebook's `parameters` cell as papermill sets them: every cell still
# runs on real data, in less time than a reader gives it
PARAMETERS = {"attention_maps": {"VIT_EPOCHS": 1, "MT_STEPS": 30}}


def with_parameters(nb, values: dict):
    """The notebook with a cell setting `values` after its `parameters` cell (papermill's injected parameters)."""
    if not values:
        return nb
    (at,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert all(f"{name} = " in nb.cells[at].source for name in values), "set only what the parameters cell names"
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in values.items())))
    return nb


def test_the_notebooks_are_there():
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "attention_maps", "generation"}
    assert {p.stem for p in NOTEBOOKS} <= set(DATASETS), "say in DATASETS which datasets a new notebook reads"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear its outputs"
        assert "execution" not in cell.metadata, f"{path.name}: clear its execution metadata"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    for name in DATASETS[path.stem]:
        real_data(name)
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(DATA_DIR))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the notebooks write their runs and caches
    nb = with_parameters(nbformat.read(path, as_version=4), PARAMETERS.get(path.stem, {}))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    assert list(tmp_path.glob("attnlab-notebook-*/**/last.ckpt"))  # it trained, under the temporary folder
    assert not list(path.parent.glob("*/")), "a notebook wrote into the repository"
