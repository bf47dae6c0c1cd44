"""The trust rule as a property (docs/runs.md, "Trusting checkpoints"): a real checkpoint and run folder of attnlab's
own, with one hostile thing put at a place hypothesis draws (a marker-touching payload, a dangerous dotted name with
arguments that would touch the marker or truncate a file, a path outside the run, a secret; in the hyperparameters
under any of Lightning's keys, the run config, a callback's state, the loops, the optimizer state, a value a sharded
folder stores as bytes, the run folder's .hydra/config.yaml, the file's own name), given to an entry point that
reads it, in this process. Whatever the draw: the marker never appears, no file outside the run changes, the secret
is written nowhere, and the command ends in success or one paragraph (exit 2), never a traceback.

The run is made once per session; `ATTNLAB_PROPERTY_EXAMPLES` sets how many draws (50 by default)."""

from __future__ import annotations

import copy
import os
import shlex
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import entry_batch
import hostile
from conftest import run_here

EXAMPLES = int(os.environ.get("ATTNLAB_PROPERTY_EXAMPLES", "50"))
SECRET_NAME, SECRET = "GITHUB_TOKEN", "prop-s3cret-51e7c2aa"
# a value of the environment whose name does not say it is a secret: only the rule for interpolations keeps it out
PLAIN_NAME, PLAIN = "DATABASE_URL", "postgres://prop-user:prop-pw@db/51e7"
NAMES = ["os.system", "attnlab.lineage.subprocess.Popen", "attnlab.cli.builders.logging.FileHandler",
         "builtins.exec", "subprocess.run", "attnlab.utils.atomic.os.remove", "hostile_import_payload.Anything"]
PLACES = ["hyper_parameters", "hparams", "module_arguments", "datamodule_hyper_parameters", "config", "callbacks",
          "loops", "optimizer_states", "dcp_bytes", "hydra_config", "file_name"]
KINDS = ["payload", "dotted", "outside_path", "secret", "env"]
# where each kind can do something (the other places are the same kind's bytes at rest) and the keys it goes to
CHECKPOINT_PLACES = [p for p in PLACES if p != "hydra_config"]
KIND_PLACES = {"payload": CHECKPOINT_PLACES, "outside_path": ["callbacks"], "env": ["hydra_config", "config"],
               "secret": ["hyper_parameters", "hparams", "config"],
               "dotted": ["hyper_parameters", "hparams", "module_arguments", "datamodule_hyper_parameters", "config",
                          "hydra_config", "file_name"]}
ANY_KEY = ["hostile", "net", "_target_", "last_model_path", "best_model_path", "dirpath", "filename", "imports", "lr"]
KIND_KEYS = {"outside_path": ["last_model_path", "last_model_path", "best_model_path", "kth_best_model_path"],
             "secret": ["net", "_target_", "hostile"]}
ENTRIES = ["eval", "predict", "export", "init_from", "ckpt_path", "preflight", "rerun", "run_dir_resume", "compare"]
# the entry points that read each place: a draw gives a place to one of them (compare reads every run folder)
RESUMES = ["ckpt_path", "run_dir_resume"]
READS = {"callbacks": [*RESUMES, "compare"], "loops": [*RESUMES, "compare"], "optimizer_states": [*RESUMES, "compare"],
         "hydra_config": ["rerun", "compare"]} | {p: ENTRIES for p in PLACES if p not in (
             "callbacks", "loops", "optimizer_states", "hydra_config")}


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """One small real run of attnlab's, and its checkpoint as loaded."""
    tmp = tmp_path_factory.mktemp("trust_property")
    env = {"ATTNLAB_LOG_DIR": str(tmp / "logs"), "ATTNLAB_CACHE_DIR": str(tmp / "cache")}
    out = run_here("train.py", *hostile.SHORT, env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    (run_dir,) = (tmp / "logs" / "train" / "runs").iterdir()
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return run_dir, state, tmp


def _hostile_value(kind: str, name: str, marker: Path, victims: Path, data):
    touch = f"touch {shlex.quote(str(marker))}"
    if kind == "payload":
        return hostile.Payload(marker)
    if kind == "dotted":  # merged into the node it is placed in: a name and the arguments it would be called with
        node = {"command": touch, "args": ["touch", str(marker)], "filename": str(victims / "log.txt"), "mode": "w"}
        return Merge({data.draw(st.sampled_from(["net", "_target_"]), "name key"): name, **node})
    if kind == "outside_path":
        # the command runs in the victims' parent folder: a relative path is one of the forms
        return data.draw(st.sampled_from([f"local://{victims / 'folder'}", f"local://{victims / 'log.txt'}",
                                          str(victims / "folder"), f"{victims}/../{victims.name}/folder",
                                          f"{victims.name}/folder", f"{victims.name}/log.txt"]))
    if kind == "secret":
        return SECRET
    return "${oc.env:" + data.draw(st.sampled_from([SECRET_NAME, PLAIN_NAME]), "variable") + "}"


def _place(node, value, path: list[int], key: str, drop_dirpath: bool = False):
    """`value` at `key` (a new key, or one it replaces) of a dict inside `node`, chosen by `path` (indices into each
    level's dict values)."""
    for i in path:
        dicts = [v for v in node.values() if isinstance(v, dict)] if isinstance(node, dict) else []
        if not dicts:
            break
        node = dicts[i % len(dicts)]
    if isinstance(value, Merge):
        node.update(value)
    else:
        node[key] = value
    if drop_dirpath:  # Lightning restores a checkpoint callback's paths only when its dirpath matches, or is gone
        node.pop("dirpath", None)


class Merge(dict):
    """Keys put beside those of the node a value is placed in."""


@pytest.mark.slow
# no shrinking: a draw costs seconds, and the failure names its place, kind, entry point and name
@settings(max_examples=EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
          phases=[Phase.explicit, Phase.reuse, Phase.generate], suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_file_from_elsewhere_runs_code_touches_outside_or_writes_a_secret(own, tmp_path_factory, data):
    run_dir, real, _ = own
    out = tmp_path_factory.mktemp("draw")
    kind = data.draw(st.sampled_from(KINDS), "kind")
    place = data.draw(st.sampled_from(KIND_PLACES[kind]), "place")
    entry = data.draw(st.sampled_from(RESUMES if kind == "outside_path" else READS[place]), "entry")
    name = data.draw(st.sampled_from(NAMES), "name")
    path = data.draw(st.lists(st.integers(0, 5), max_size=2), label="path")
    key = data.draw(st.sampled_from(KIND_KEYS.get(kind, ANY_KEY)), "key")
    drop = kind == "outside_path" or data.draw(st.booleans(), "drop dirpath")
    marker, victims = out / "markers" / "ran", out / "victims"
    (victims / "folder").mkdir(parents=True)
    (victims / "folder" / "notes.txt").write_text("outside\n")
    (victims / "log.txt").write_text("outside\n")
    marker.parent.mkdir()
    (out / "modules").mkdir()
    (out / "modules" / "hostile_import_payload.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    before = hostile.victim_state(out)

    folder = out / "run"
    shutil.copytree(run_dir, folder, ignore=shutil.ignore_patterns("checkpoints"))
    (folder / "checkpoints").mkdir()
    state = copy.deepcopy(real)
    value = _hostile_value(kind, name, marker, victims, data)
    ckpt = folder / "checkpoints" / "last.ckpt"
    config_path = folder / ".hydra" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    if place == "hydra_config":
        _place(config, value if not isinstance(value, hostile.Payload) else name, path, key)
    elif place == "file_name":
        state["hyper_parameters"] |= {"net": "os.system", "command": f"touch {shlex.quote(str(marker))}"}
        ckpt = folder / "checkpoints" / f"weights-{name}-v2.ckpt"
    elif place == "dcp_bytes":
        state["state_dict"]["hostile"] = value
    elif place == "config":
        _place(state["attnlab"]["config"], value, path, key)
    elif place in ("hparams", "module_arguments", "datamodule_hyper_parameters") and place not in state:
        state[place] = {}
        _place(state[place], value, path, key)
    elif place == "optimizer_states":
        _place(state["optimizer_states"][0], value, path, key)
    elif kind == "outside_path":  # a checkpoint callback's state forged whole: each path of it outside the run
        holders = [v for v in state["callbacks"].values() if isinstance(v, dict) and "last_model_path" in v]
        holder = holders[path[0] % len(holders)] if path else holders[0]
        for k in dict.fromkeys(KIND_KEYS[kind]):
            _place(holder, value if k == key else _hostile_value(kind, name, marker, victims, data), [], k, drop)
        holder["best_k_models"] = {_hostile_value(kind, name, marker, victims, data): torch.tensor(-1.0)}
    else:
        _place(state[place], value, path, key, drop)
    if place == "dcp_bytes":
        ckpt.mkdir()
        hostile._sharded(state, ckpt)
    else:
        torch.save(state, ckpt)
        if ckpt.name != "last.ckpt":
            torch.save(state, folder / "checkpoints" / "last.ckpt")
    config["ckpt_path"] = str(ckpt)
    config_path.write_text(yaml.safe_dump(config))

    built = max(p.stat().st_mtime_ns for p in out.rglob("*"))
    h = hostile.Hostile("drawn", ckpt, folder, marker)
    script, args = hostile.ENTRIES[entry](h)
    if script == "train.py" and "--rerun" not in args:
        args = [*args, "trainer.max_epochs=2"]  # a resumed run trains on, and saves again
    env = {"ATTNLAB_LOG_DIR": str(out / "logs"), "ATTNLAB_CACHE_DIR": str(out / "cache"),
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", SECRET_NAME: SECRET, PLAIN_NAME: PLAIN}
    cwd = out if kind == "outside_path" else out / "modules"
    result = entry_batch.run_here({"name": "drawn", "script": script, "args": args, "cwd": str(cwd),
                                   "env": env})
    note = f"{place}/{kind}/{entry}/{name}: {result['output'][-3000:]}"
    assert not marker.exists(), note
    assert hostile.victim_state(out) == before, note
    assert "Traceback" not in result["output"] and result["code"] in (0, 2), note
    if kind == "outside_path" and result["code"] == 0:  # the paths are dropped as the state is restored, and said
        assert "outside this run's checkpoint folder" in result["output"] and "dropped" in result["output"], note
    if result["code"] == 2:
        assert "\n" not in result["output"].split("attnlab: error: ", 1)[-1].strip(), note
    assert SECRET not in result["output"] and PLAIN not in result["output"], note
    for p in out.rglob("*"):  # what the command wrote: its run folders, and what it added to the one it resumed
        if p.is_file() and (p.is_relative_to(out / "logs") or p.stat().st_mtime_ns > built) and not (
                kind == "secret" and p.suffix == ".ckpt"):  # a checkpoint carries a file's own state on, as it is
            data_ = p.read_bytes()
            assert SECRET.encode() not in data_ and PLAIN.encode() not in data_, f"{p}: {note}"


# the forms a path to the same place can take, as a restored state could give it to Lightning's removal
FORMS = ["absolute", "relative", "dotdot", "local", "file", "through_link", "trailing_slash"]


@settings(max_examples=4 * EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")))
@given(form=st.sampled_from(FORMS), target=st.sampled_from(["victims", "victims/notes.txt", "checkpoints/..",
                                                            "checkpoints/epoch=0.ckpt", "checkpoints"]))
def test_lightnings_removal_removes_only_files_of_the_runs_checkpoint_folder(tmp_path_factory, form, target):
    """Whatever path a callback's state holds when Lightning prunes it (the top-k one no longer best, last.ckpt's
    previous file), only a file inside the run's checkpoint folder is removed: a folder outside, a file outside,
    the folder itself, in any form (relative to the working folder, through `..`, a protocol, a link inside the
    folder to a folder outside)."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from attnlab.callbacks import ModelCheckpoint

    top = tmp_path_factory.mktemp("removal")
    ckpts = top / "run" / "checkpoints"
    (top / "victims").mkdir()
    (top / "victims" / "notes.txt").write_text("outside\n")
    ckpts.mkdir(parents=True)
    (ckpts / "epoch=0.ckpt").write_text("own\n")
    (ckpts / "elsewhere").symlink_to(top / "victims")
    place = top / "run" / target if target.startswith("checkpoints") else top / target
    path = {"absolute": str(place), "relative": os.path.relpath(place, top),
            "dotdot": f"{ckpts}/../../{os.path.relpath(place, top)}", "local": f"local://{place}",
            "file": f"file://{place}", "trailing_slash": f"{place}/",
            "through_link": str(ckpts / "elsewhere" / os.path.relpath(place, top / "victims"))}[form]
    own = target == "checkpoints/epoch=0.ckpt" and form in ("absolute", "relative", "dotdot")
    cwd = os.getcwd()
    os.chdir(top)
    try:
        callback = ModelCheckpoint(dirpath=str(ckpts))
        io = TorchCheckpointIO()
        callback._remove_checkpoint(SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(
            remove_checkpoint=io.remove_checkpoint)), path)
    finally:
        os.chdir(cwd)
    assert (top / "victims" / "notes.txt").read_text() == "outside\n", path
    assert ckpts.is_dir() and (top / "run").is_dir(), path  # (a link of the folder is a file of it)
    if own:  # a file of the folder, however it is named, is still removed
        assert not (ckpts / "epoch=0.ckpt").exists(), path
