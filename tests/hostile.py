"""Hostile files, made from one real run folder: each kind of file from elsewhere that could run code, damage a file
outside the run or crash attnlab when it reads it. A pickle payload beside the weights, in the hyperparameters or in
the optimizer state; a bare pickle bomb; a payload in a sharded checkpoint's .metadata or in a value its shards store
as bytes; a config naming a module that runs code at import, an optimizer `_target_` with a side effect, a standard
library class through an attnlab module, a data module that would truncate a file; Lightning's older hyperparameter
keys; a dotted word in the file's own name; callback state naming paths outside the run; a damaged zip. Each payload
creates its marker file when it runs (`marker(kind)`), and `victims(out)` holds files outside every run: a test
asserts that no marker appears and no victim changes.

`build(run_dir, out)` -> {kind: Hostile}: the hostile checkpoint (a file, or a sharded folder), and a run folder
holding it as its `checkpoints/last.ckpt` whose `.hydra/config.yaml` names it (`ckpt_path`, for `--rerun`) or names
the hostile module or callable itself."""

from __future__ import annotations

import os
import pickle
import shlex
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

# the kinds, and what the refusal of each says (a regex)
MESSAGES = {
    "beside_weights": r"asks for posix\.system.*trust_checkpoint=true",
    "in_hparams": r"asks for posix\.system.*trust_checkpoint=true",
    "in_optimizer_state": r"asks for posix\.system.*trust_checkpoint=true",
    "bare_pickle": r"is not a PyTorch checkpoint \(the zip archive torch\.save writes\): it is a bare pickle that asks "
                   r"for posix\.system",
    "sharded_metadata": r"\(its \.metadata, torch\.distributed\.checkpoint's\) asks for posix\.system.*"
                        r"trust_checkpoint=true",
    "module_import": r"names the module hostile_import_payload \(.*extras\.imports.*trust_checkpoint=true",
    "optimizer_target": r"names logging\.basicConfig \(.*optimizer\._target_\).*trust_checkpoint=true",
    "damaged_zip": r"is a damaged checkpoint: it begins as the zip archive torch\.save writes",
    # a value of the model's state that DCP stores as bytes, read back by its own full torch.load
    "sharded_bytes": r"shards store as bytes\) asks for posix\.system.*trust_checkpoint=true",
    # a standard library class that an attnlab module imports resolves as a dotted path under attnlab.
    "through_attnlab": r"names attnlab\.lineage\.subprocess\.Popen \(hyper_parameters\.net\).*trust_checkpoint",
    # Lightning's older hyperparameter keys, merged into the task's arguments
    "hparams_key": r"names os\.system \(hparams\.net\).*trust_checkpoint=true",
    "module_arguments_key": r"names os\.system \(module_arguments\.net\).*trust_checkpoint=true",
    # a data module config that would truncate a file outside the run
    "truncating_target": r"names attnlab\.cli\.builders\.logging\.FileHandler \(config\.data\._target_\)",
    # the file's own name holds a dotted word
    "dotted_file_name": r"names os\.system \(hyper_parameters\.net\).*trust_checkpoint=true",
    # restored callback state naming paths outside the run: harmless (the run goes on, nothing outside it changes)
    "outside_paths": None,
}
PAYLOADS = [k for k in MESSAGES if k not in ("damaged_zip", "outside_paths")]
# kinds given to some entry points only (the others are those of every kind): a state restored only by a run that
# trains on from it, with an epoch left to train
ONLY = {"outside_paths": ("ckpt_path", "run_dir_resume")}
EXTRA = {"outside_paths": ["trainer.max_epochs=2"]}
MODULE = "hostile_import_payload"


class Payload:
    """Runs `touch <marker>` when unpickled (pickled as os.system with its command)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


@dataclass
class Hostile:
    kind: str
    ckpt: Path      # the file (or sharded folder) to give as ckpt_path= / model.init_from=
    run_dir: Path   # a run folder whose checkpoints/last.ckpt it is, for the run's own resume and --rerun
    marker: Path


def marker(out: Path, kind: str) -> Path:
    return out / "markers" / kind


def victims(out: Path) -> Path:
    """A folder outside every run, with a file in it: what no hostile file may change or delete."""
    return out / "victims"


def victim_state(out: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(victims(out).rglob("*")) if p.is_file()}


def _sharded(ckpt: dict, folder: Path) -> None:
    """A sharded checkpoint folder as Lightning's FSDP strategy writes it: DCP shards and .metadata, meta.pt."""
    import torch.distributed.checkpoint as dcp

    rest = dict(ckpt)
    state = {"model": rest.pop("state_dict")}
    rest.pop("optimizer_states", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized, assuming ... a single process"
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    torch.save(rest, folder / "meta.pt")


def _config_with(config: dict, kind: str, out: Path, ckpt: Path) -> dict:
    config = yaml.safe_load(yaml.safe_dump(config))
    if kind == "module_import":
        config.setdefault("extras", {})["imports"] = [MODULE]
    elif kind == "optimizer_target":  # builds a logging FileHandler on the marker (force: drops the handlers first)
        config["optimizer"] = {"_target_": "logging.basicConfig", "force": True,
                               "filename": str(marker(out, kind)), "lr": 0.001}
    else:  # the run resumed from the hostile file: its rerun reads it too
        config["ckpt_path"] = str(ckpt)
    return config


def build(run_dir: Path, out: Path) -> dict[str, Hostile]:
    """Every kind of hostile file, made from the real run folder `run_dir`, under `out`; the hostile module
    (`hostile_import_payload.py`) in `out / "modules"`, to be put on PYTHONPATH."""
    real = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    (out / "markers").mkdir(parents=True, exist_ok=True)
    modules = out / "modules"
    modules.mkdir(exist_ok=True)
    (modules / f"{MODULE}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker(out, 'module_import'))!r}).touch()\n")
    saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    (victims(out) / "folder").mkdir(parents=True, exist_ok=True)
    (victims(out) / "folder" / "notes.txt").write_text("a file outside every run\n")
    (victims(out) / "log.txt").write_text("a log outside every run\n")
    made = {}
    for kind in MESSAGES:
        folder = out / kind
        shutil.copytree(run_dir, folder, ignore=shutil.ignore_patterns("checkpoints"))
        (folder / "checkpoints").mkdir()
        ckpt = folder / "checkpoints" / "last.ckpt"
        state = pickle.loads(pickle.dumps(real))
        payload = Payload(marker(out, kind))
        touch = f"touch {shlex.quote(str(marker(out, kind)))}"
        if kind == "sharded_bytes":
            state["state_dict"]["extra"] = payload
        elif kind == "through_attnlab":
            state["hyper_parameters"]["net"] = "attnlab.lineage.subprocess.Popen"
            state["hyper_parameters"]["args"] = ["touch", str(marker(out, kind))]
        elif kind in ("hparams_key", "module_arguments_key"):
            state[kind.removesuffix("_key")] = {"net": "os.system", "command": touch}
        elif kind == "dotted_file_name":
            state["hyper_parameters"] |= {"net": "os.system", "command": touch}
            torch.save(state, ckpt)  # its run folder's own last.ckpt too
            ckpt = folder / "checkpoints" / "weights-os.system-v2.ckpt"
        elif kind == "truncating_target":
            config = yaml.safe_load(yaml.safe_dump(state["attnlab"]["config"]))
            config["data"] = {"_target_": "attnlab.cli.builders.logging.FileHandler",
                              "filename": str(victims(out) / "log.txt"), "mode": "w"}
            state["attnlab"]["config"] = config
        elif kind == "outside_paths":
            for key in [k for k in state["callbacks"] if "ModelCheckpoint" in k]:
                callback = state["callbacks"][key]
                callback.pop("dirpath", None)
                callback["last_model_path"] = f"local://{victims(out) / 'folder'}"
                callback["best_k_models"] = {str(victims(out) / "log.txt"): torch.tensor(-1.0)}
                callback["kth_best_model_path"] = callback["best_model_path"] = str(victims(out) / "log.txt")
        if kind == "beside_weights":
            state["extra"] = payload
        elif kind == "in_hparams":
            state["hyper_parameters"]["note"] = payload
        elif kind == "in_optimizer_state":
            state["optimizer_states"][0]["param_groups"][0]["schedule"] = payload
        elif kind in ("module_import", "optimizer_target"):
            config = _config_with(state["attnlab"]["config"], kind, out, ckpt)
            state["attnlab"]["config"] = config
            if kind == "optimizer_target":
                state["hyper_parameters"]["optimizer"] = config["optimizer"] | {"_partial_": True}
        if kind == "bare_pickle":
            ckpt.write_bytes(pickle.dumps(payload))
        elif kind == "sharded_bytes":
            ckpt.mkdir()
            _sharded(state, ckpt)
        elif kind == "sharded_metadata":
            ckpt.mkdir()
            _sharded(state, ckpt)
            metadata = pickle.loads((ckpt / ".metadata").read_bytes())
            metadata.storage_meta = payload
            (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
        elif kind == "damaged_zip":
            whole = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
            ckpt.write_bytes(whole[: len(whole) // 2])  # a copy cut short: its list of files (at the end) is gone
        else:
            torch.save(state, ckpt)
        hydra_config = _config_with(saved, kind, out, ckpt)
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(hydra_config))
        made[kind] = Hostile(kind, ckpt, folder, marker(out, kind))
    return made


if __name__ == "__main__":  # python tests/hostile.py <run dir> <out>: the files, for trying them by hand
    for h in build(Path(sys.argv[1]), Path(sys.argv[2])).values():
        print(h.kind, h.ckpt)


# the entry points, each given a hostile file (or the run folder holding it): name -> its command
SHORT = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "data.num_workers=0", "callbacks.progress_bar=null",
         "extras.print_config=false"]
ENTRIES = {
    "eval": lambda h: ("eval.py", [f"ckpt_path={h.ckpt}", "trainer.limit_test_batches=1"]),
    "predict": lambda h: ("predict.py", [f"ckpt_path={h.ckpt}"]),
    "export": lambda h: ("export.py", [f"ckpt_path={h.ckpt}"]),
    "init_from": lambda h: ("train.py", [f"model.init_from={h.ckpt}", *SHORT]),
    "ckpt_path": lambda h: ("train.py", [f"ckpt_path={h.ckpt}", *SHORT]),
    "preflight": lambda h: ("train.py", ["preflight=true", "preflight_steps=1", f"ckpt_path={h.ckpt}", *SHORT]),
    "rerun": lambda h: ("train.py", ["--rerun", str(h.ckpt)]),  # the file, in the run folder it names
    # after --rerun: Hydra writes this command's own .hydra/config.yaml into the run folder
    "run_dir_resume": lambda h: ("train.py", [f"hydra.run.dir={h.run_dir}", *SHORT]),
    "compare": lambda h: ("compare", [str(h.run_dir)]),
}
# the entry points that never read a checkpoint (a run folder's config.yaml, metrics and curves): they succeed
READS_NO_CHECKPOINT = ("compare",)


def cases(made: dict[str, Hostile], out: Path, entries=ENTRIES, kinds=None) -> list[dict]:
    """entry_batch.py's cases: every entry point given every hostile file, from the folder holding the hostile module
    (importable there, as the working directory is)."""
    env = {"ATTNLAB_LOG_DIR": str(out / "logs"), "ATTNLAB_CACHE_DIR": str(out / "cache")}
    found = []
    for kind, h in made.items():
        if kinds is not None and kind not in kinds:
            continue
        for entry, command in entries.items():
            if entry not in ONLY.get(kind, entries):
                continue
            script, args = command(h)
            args = [*args, *EXTRA.get(kind, [])] if script == "train.py" and "--rerun" not in args else args
            found.append({"name": f"{kind}/{entry}", "script": script, "args": args, "cwd": str(out / "modules"),
                          "env": env})
    return found
