"""Files from elsewhere cannot run code (docs/runs.md, "Trusting checkpoints"): every hostile file (tests/hostile.py),
made from one real run, given to every entry point that reads a checkpoint, ends in the paragraph for its kind, exit
status 2, no traceback, its payload never run; attnlab's own checkpoints hold nothing but tensors and plain values;
and the run folder holds no secret the run was given."""

from __future__ import annotations

import json
import os
import pickle
import re
import zipfile
from pathlib import Path

import pytest
import torch

import hostile
from attnlab.errors import UserError
from conftest import run_cli, wandb_offline

# a W&B key given on the command line and one in the environment: neither may reach the run folder
SECRET_OVERRIDE, SECRET_ENV = "override-s3cret-5d1f2e9a", "environment-s3cret-9a8b7c6d"
# and every other way a secret comes: a dict-valued override, Hydra's env_set, an interpolation of the environment,
# keys and environment variables named in other styles
OTHER_SECRETS = {"dict": "dict-s3cret-77aa01", "env_set": "envset-s3cret-88bb02", "aws": "aws-s3cret-99cc03",
                 "github": "gh-s3cret-11dd04", "openai": "openai-s3cret-22ee05"}
SECRET_ARGS = ["logger=wandb", f"+logger.wandb.settings.api_key={SECRET_OVERRIDE}",
               f"+foo={{token:{OTHER_SECRETS['dict']}}}", f"+hydra.job.env_set.HF_API_TOKEN={OTHER_SECRETS['env_set']}",
               "+notes=${oc.env:AWS_SECRET_ACCESS_KEY}", f"+openai_api_key={OTHER_SECRETS['openai']}"]
SECRET_ENVIRONMENT = {"WANDB_API_KEY": SECRET_ENV, "AWS_SECRET_ACCESS_KEY": OTHER_SECRETS["aws"],
                      "GITHUB_TOKEN": OTHER_SECRETS["github"]}
SECRETS = [SECRET_OVERRIDE, SECRET_ENV, *OTHER_SECRETS.values()]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """ONE small real run (W&B offline, so that its checkpoints carry a logger's id), with every kind of secret."""
    tmp = tmp_path_factory.mktemp("hostile_base")
    env = wandb_offline(tmp) | SECRET_ENVIRONMENT | {"ATTNLAB_LOG_DIR": str(tmp / "logs"),
                                                     "ATTNLAB_CACHE_DIR": str(tmp / "cache")}
    out = run_cli("train.py", *SECRET_ARGS, *hostile.SHORT, "extras.print_config=true", env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    (run_dir,) = (tmp / "logs" / "train" / "runs").iterdir()
    return run_dir, out.stdout


@pytest.fixture(scope="module")
def matrix(base, tmp_path_factory):
    """Every entry point given every hostile file, in one process (tests/entry_batch.py), under an environment that
    asks torch for full unpickling (which only an unset weights_only obeys)."""
    out = tmp_path_factory.mktemp("hostile")
    made = hostile.build(base[0], out)
    before = hostile.victim_state(out)
    cases = hostile.cases(made, out)
    for case in cases:
        case["env"]["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    (out / "cases.json").write_text(json.dumps(cases))
    proc = run_cli("tests/entry_batch.py", str(out / "cases.json"), str(out / "report.json"), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert hostile.victim_state(out) == before  # nothing outside the runs changed: not truncated, not deleted
    return json.loads((out / "report.json").read_text()), made, out


@pytest.mark.slow
@pytest.mark.parametrize("kind,entry", [(k, e) for k in hostile.MESSAGES for e in hostile.ENTRIES
                                        if e in hostile.ONLY.get(k, hostile.ENTRIES)])
def test_every_entry_point_refuses_every_hostile_file(matrix, kind, entry):
    report, made, _ = matrix
    result = report[f"{kind}/{entry}"]
    assert "Traceback" not in result["output"], result["output"][-3000:]
    assert not made[kind].marker.exists()
    if entry in hostile.READS_NO_CHECKPOINT:  # attnlab-compare reads config.yaml, metrics and curves, no checkpoint
        assert result["code"] == 0, result["output"][-3000:]
        return
    if hostile.MESSAGES[kind] is None:  # made harmless: the run trains on, saying what it dropped
        assert result["code"] == 0, result["output"][-3000:]
        assert re.search(r"names \d+ paths? outside this run's checkpoint folder", result["output"]), \
            result["output"][-3000:]
        return
    assert result["code"] == 2, result["output"][-3000:]
    message = result["output"].split("attnlab: error: ", 1)[-1].strip()
    assert re.search(hostile.MESSAGES[kind], message, re.S), message
    assert "\n" not in message  # one paragraph


@pytest.mark.slow
def test_no_payload_ran(matrix):
    _, _, out = matrix
    assert not list((out / "markers").iterdir())


def test_attnlab_checkpoints_hold_only_tensors_and_plain_values(base):
    """The run's metadata, the data position and RNG state, the optimizer's and the schedule's states, the logger's
    id: nothing a weights_only load refuses."""
    run_dir, _ = base
    for ckpt in (run_dir / "checkpoints").glob("*.ckpt"):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(ckpt)) == []
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        assert state["attnlab"]["wandb_run_id"] and state["optimizer_states"] and state["lr_schedulers"]
        assert state["loops"]["fit_loop"]["state_dict"] is not None


def test_the_run_folder_holds_no_secret(base):
    """Not in config.yaml, .hydra/, the lineage, the logs, the checkpoints or W&B's files (its config included)."""
    run_dir, stdout = base
    assert not [s for s in SECRETS if s in stdout]
    assert (run_dir / "config_tree.log").is_file()
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in SECRETS if s.encode() in data], path
    written = (run_dir / "config.yaml").read_text()
    assert "api_key: <redacted>" in written and "token: <redacted>" in written and "notes: <redacted>" in written
    (wandb_run,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert b"<redacted>" in wandb_run.read_bytes()  # W&B got the config, the key masked
    printed = run_cli("train.py", "--cfg", "job", *SECRET_ARGS, env=SECRET_ENVIRONMENT)
    assert printed.returncode == 0 and "logger:" in printed.stdout, printed.stdout[-2000:]
    assert not [s for s in SECRETS if s in printed.stdout]


def test_the_secret_reaches_the_logger_in_memory(monkeypatch):
    from omegaconf import OmegaConf

    from attnlab import redact

    monkeypatch.setenv(redact.SECRET_ENV, "[]")  # restored when the test ends: what it takes stays in the test
    argv = redact.take_secret_overrides(["logger=wandb", f"+logger.wandb.settings.api_key={SECRET_OVERRIDE}",
                                         "data.max_tokens=12", "trainer.max_epochs=1"])
    assert argv == ["logger=wandb", "data.max_tokens=12", "trainer.max_epochs=1"]
    cfg = OmegaConf.create({"logger": {"wandb": {"project": "p"}}})
    redact.restore(cfg)
    assert cfg.logger.wandb.settings.api_key == SECRET_OVERRIDE
    assert redact.redact({"a": [f"x{SECRET_OVERRIDE}y"], "hf_token": "t", "pad_token": 3}) == {
        "a": ["x<redacted>y"], "hf_token": "<redacted>", "pad_token": 3}


# ---- the one reader, one kind of file at a time

def _real(base) -> bytes:
    return (base[0] / "checkpoints" / "last.ckpt").read_bytes()


def test_each_kind_of_file_gets_its_own_paragraph(base, tmp_path):
    from attnlab.checkpoints.reading import load_checkpoint

    real = _real(base)
    with zipfile.ZipFile(base[0] / "checkpoints" / "last.ckpt") as zf:
        pkl = zf.getinfo(next(n for n in zf.namelist() if n.endswith("/data.pkl")))
    corrupt = bytearray(real)
    start = pkl.header_offset + len(pkl.filename) + 80
    corrupt[start:start + 40] = bytes(b ^ 0x55 for b in corrupt[start:start + 40])
    other_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(other_zip, "w") as zf:
        zf.writestr("notes.txt", "hello")
    files = {"text": (b"epoch: 3\n", r"not a PyTorch checkpoint .*: it is a file of another kind"),
             "empty": (b"", r"not a PyTorch checkpoint .*: it is an empty file"),
             "zip": (other_zip.read_bytes(), r"it is a zip archive without the data\.pkl"),
             "cut": (real[: len(real) // 3], r"is a damaged checkpoint: it begins as the zip archive"),
             "four_bytes": (real[:4], r"is a damaged checkpoint"),
             "corrupt_pickle": (bytes(corrupt), r"is a damaged checkpoint")}
    for name, (data, message) in files.items():
        path = tmp_path / f"{name}.ckpt"
        path.write_bytes(data)
        with pytest.raises(UserError, match=message):
            load_checkpoint(path)
    plain = tmp_path / "list.ckpt"
    torch.save([torch.ones(2)], plain)
    with pytest.raises(UserError, match=r"holds a list, not a checkpoint dict"):
        load_checkpoint(plain)


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_payload_is_refused_whatever_the_pickle_protocol_or_format(tmp_path, protocol, monkeypatch):
    from attnlab.checkpoints.io import AtomicCheckpointIO
    from attnlab.checkpoints.reading import load_checkpoint

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    path = tmp_path / "p.ckpt"
    for legacy in (False, True):
        torch.save({"w": torch.ones(2), "x": hostile.Payload(marker)}, path, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=not legacy)
        with pytest.raises(UserError, match=r"asks for posix\.system.*trust_checkpoint=true"):
            load_checkpoint(path)
        with pytest.raises(UserError, match=r"asks for posix\.system"):  # Lightning's own loads: the same reader
            AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not marker.exists()
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)  # PyTorch < 1.6's format, safe
    assert load_checkpoint(path)["w"].sum() == 2


def test_trust_loads_in_full(tmp_path):
    from argparse import Namespace

    from attnlab.checkpoints.reading import load_checkpoint

    path = tmp_path / "namespace.ckpt"
    torch.save({"hyper_parameters": {"args": Namespace(lr=0.5)}}, path)  # Lightning's older hparams
    with pytest.raises(UserError, match=r"asks for argparse\.Namespace"):
        load_checkpoint(path)
    assert load_checkpoint(path, trusted=True)["hyper_parameters"]["args"].lr == 0.5


def test_a_payload_in_a_sharded_checkpoints_meta_pt(base, tmp_path):
    from attnlab.checkpoints.reading import load_checkpoint

    state = torch.load(base[0] / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    hostile._sharded(state | {"extra": hostile.Payload(tmp_path / "ran")}, folder)
    with pytest.raises(UserError, match=r"asks for posix\.system"):
        load_checkpoint(folder)
    assert not (tmp_path / "ran").exists()
    (folder / "meta.pt").unlink()
    hostile._sharded(state, folder)  # whole again: read like the file
    assert load_checkpoint(folder)["state_dict"].keys() == state["state_dict"].keys()


def test_what_a_file_names_is_built_only_from_the_table_or_the_commands_own_config(monkeypatch):
    """attnlab.checkpoints.trust.decide: exact names of the table, or the command's own config at the same key, or what a module
    of the command's own extras.imports defines; never what merely resolves, nor a word elsewhere on the command."""
    from attnlab.checkpoints import trust

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "userproject"))
    import userpkg.nets  # noqa: F401  (extras.imports has imported it by the time anything is built)

    trust.from_command({"extras": {"imports": ["userpkg.nets"]}, "model": {"_target_": "mypkg.tasks.Mine"},
                        "ckpt_path": "weights-os.system-v2.ckpt", "task_name": "os.system"})
    refused = {name: trust.refused_name(node) for name, node in {
        "attnlab class": {"model": {"_target_": "attnlab.tasks.classification.ImageClassifier"}},
        "packaged optimizer": {"optimizer": {"_target_": "torch.optim.AdamW"}},
        "its qualified name": {"optimizer": {"_target_": "torch.optim.adamw.AdamW"}},
        "named by the command": {"model": {"_target_": "mypkg.tasks.Mine"}},
        "defined in an import": {"model": {"net": "userpkg.nets.TinyCNN"}},
        "timm name": {"model": {"backbone": "vit_base_patch16_224.augreg_in21k"}},
        "the command's name at another key": {"optimizer": {"_target_": "mypkg.tasks.Mine"}},
        "imported by an import": {"model": {"net": "userpkg.nets.nn.Module"}},
        "attnlab function": {"optimizer": {"_target_": "attnlab.utils.atomic.write_text"}},
        "stdlib class through attnlab": {"model": {"net": "attnlab.lineage.subprocess.Popen"}},
        "stdlib through attnlab's builders": {"data": {"_target_": "attnlab.cli.builders.logging.FileHandler"}},
        "stdlib callable": {"scheduler": {"_target_": "os.system"}},
        "a word of the command": {"model": {"net": "os.system"}},
        "an import": {"extras": {"imports": ["evil"]}},
        "a dotted network": {"model": {"net": "evil.Net"}},
    }.items()}
    assert {k for k, v in refused.items() if v is None} == {
        "attnlab class", "packaged optimizer", "its qualified name", "named by the command", "defined in an import",
        "timm name"}
    assert refused["an import"] == ("extras.imports[0]", "module", "evil")
    assert refused["a dotted network"] == ("model.net", "callable", "evil.Net")
    # a checkpoint's hyperparameters, under every key Lightning reads, are the run config's model keys
    for part in ("hyper_parameters", "hparams", "module_arguments"):
        assert trust.refused_name({part: {"net": "os.system"}}) == (f"{part}.net", "callable", "os.system")
        assert trust.refused_name({part: {"net": "userpkg.nets.TinyCNN"}}) is None
    assert trust.refused_name({"extras": {"imports": ["evil"]}}, trusting=True) is None


def test_a_cifar_batch_is_read_without_running_anything(tmp_path):
    import numpy as np

    from attnlab.data.images.cifar import _unpickle

    batch = {"data": np.arange(12, dtype=np.uint8).reshape(1, 12), "labels": [3], "filenames": [b"a.png"]}
    for protocol in (2, 5):
        (tmp_path / "batch").write_bytes(pickle.dumps(batch, protocol=protocol))
        assert _unpickle(tmp_path / "batch")["data"].sum() == 66
    (tmp_path / "batch").write_bytes(pickle.dumps(batch | {"x": hostile.Payload(tmp_path / "ran")}))
    with pytest.raises(UserError, match=r"asks for posix\.system, which a CIFAR python batch .* never holds"):
        _unpickle(tmp_path / "batch")
    assert not (tmp_path / "ran").exists()


def test_hugging_face_weights_load_without_pickle_or_weights_only(tmp_path):
    from safetensors.torch import save_file

    from attnlab.transfer.hf import read_weights

    weights = {"wte.weight": torch.ones(4, 2)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    assert read_weights(tmp_path)["wte.weight"].sum() == 8
    (tmp_path / "model.safetensors").unlink()
    torch.save(weights, tmp_path / "pytorch_model.bin")
    assert read_weights(tmp_path)["wte.weight"].sum() == 8
    torch.save(weights | {"x": hostile.Payload(tmp_path / "ran")}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match=r"model\.init_from: .*pytorch_model\.bin asks for posix\.system"):
        read_weights(tmp_path)
    assert not (tmp_path / "ran").exists()


def test_token_caches_load_without_pickle(tmp_path):
    """A token cache whose document index is a pickle is built again, never unpickled; no reader in attnlab asks
    numpy for pickles, and every torch.load names weights_only."""
    import ast

    import numpy as np

    from attnlab.data.text.token_arrays import _intact

    index = np.array([hostile.Payload(tmp_path / "ran")], dtype=object)
    np.save(tmp_path / "train.docs.npy", index, allow_pickle=True)
    (tmp_path / "train.bin").write_bytes(b"\0" * 8)
    assert not _intact(tmp_path / "train.bin", tmp_path / "train.docs.npy", 2)
    assert not (tmp_path / "ran").exists()
    src = Path(__file__).resolve().parents[1] / "src" / "attnlab"
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name, keywords = ast.unparse(node.func), {k.arg: ast.unparse(k.value) for k in node.keywords}
            where = f"{path.relative_to(src)}:{node.lineno}"
            assert name not in ("pickle.load", "pickle.loads", "joblib.load", "dill.load"), where
            if name in ("np.load", "numpy.load"):
                assert keywords.get("allow_pickle", "False") == "False", where
            if name == "torch.load":
                assert "weights_only" in keywords, where


def test_the_report_escapes_everything_from_a_run_folder(tmp_path, monkeypatch):
    """Run names, config values and metric names from a run folder are text in the HTML report; a resolver a run's
    config.yaml names (${oc.env:...}) is never called."""
    from attnlab.compare.cli import compare

    script = "<script>alert(1)</script>"
    monkeypatch.setenv("ATTNLAB_TEST_SECRET_TOKEN", "do-not-show-this")
    for i, name in enumerate(["<script>run", "plain"]):
        run = tmp_path / "runs" / name
        (run / "csv").mkdir(parents=True)
        (run / "config.yaml").write_text(
            f"model:\n  _target_: x.Task\n  note: '{script}{i}'\n  home: '${{oc.env:ATTNLAB_TEST_SECRET_TOKEN}}{i}'\n")
        (run / "metrics.json").write_text(json.dumps({"val/acc": 0.5 + i / 10, f"val/{script}": 1.0}))
        (run / "csv" / "metrics.csv").write_text(f"step,val/acc,val/{script}\n1,0.1,1\n2,0.2,2\n")
    report = tmp_path / "report.html"
    compare([str(tmp_path / "runs")], report=report)
    page = report.read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "do-not-show-this" not in page and "oc.env:ATTNLAB_TEST_SECRET_TOKEN" in page
    assert os.environ["ATTNLAB_TEST_SECRET_TOKEN"] == "do-not-show-this"


def test_a_run_folder_never_trusts_itself(tmp_path):
    """--rerun: what the folder's config names is built only where the command names it or trusts the folder; a
    trust_checkpoint the folder's own config sets counts for nothing."""
    import yaml

    from attnlab.checkpoints import trust
    from attnlab.cli import rerun

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(
        {"task_name": "train", "trust_checkpoint": True, "optimizer": {"_target_": "os.system", "command": "x"}}))
    try:
        with pytest.raises(UserError, match=r"--rerun .* names os\.system \(optimizer\._target_\)"):
            rerun.config(run_dir, [], tmp_path / "out")
        cfg = rerun.config(run_dir, ["trust_checkpoint=true"], tmp_path / "out")
        assert cfg.trust_checkpoint is True and trust.trusted()
        cfg = rerun.config(run_dir, ["optimizer._target_=torch.optim.SGD"], tmp_path / "out")  # named by the command
        assert cfg.trust_checkpoint is False and not trust.trusted()
    finally:
        trust.from_command({})
        rerun._run_dir, rerun._asked, rerun._given = None, [], None


def test_a_cifar_batch_relabelled_as_object_dtype_is_refused(tmp_path):
    """Its int64 bytes would be read as object pointers (a crash, exit 139): the dtype is refused before."""
    import numpy as np

    from attnlab.data.images.cifar import _unpickle

    for protocol in (2, 5):
        raw = pickle.dumps({"data": np.arange(4, dtype=np.int64), "labels": [1]}, protocol=protocol)
        forged = raw.replace(b"\x02\x00\x00\x00i8", b"\x02\x00\x00\x00O8")
        if forged == raw:  # protocol 5 writes the dtype's name as a short string
            forged = raw.replace(b"\x8c\x02i8", b"\x8c\x02O8")
        assert forged != raw
        (tmp_path / "batch").write_bytes(forged)
        with pytest.raises(UserError, match=r"asks for a numpy array of dtype '\|O'"):
            _unpickle(tmp_path / "batch")


def test_a_hugging_face_index_names_shards_inside_its_folder_only(tmp_path):
    from safetensors.torch import save_file

    from attnlab.transfer.hf import read_weights

    folder, outside = tmp_path / "model", tmp_path / "elsewhere.safetensors"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, str(outside))
    save_file({"w": torch.ones(3)}, str(folder / "part-1.safetensors"))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "part-1.safetensors"}}))
    assert read_weights(folder)["w"].sum() == 3
    for name in ("../elsewhere.safetensors", str(outside), "sub/../../elsewhere.safetensors"):
        index.write_text(json.dumps({"weight_map": {"w": name}}))
        with pytest.raises(UserError, match=r"names the shard .* which is not a file of"):
            read_weights(folder)


def test_restored_callback_paths_outside_the_run_are_dropped(tmp_path):
    from attnlab.callbacks.checkpoint import confined

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    inside = str(ckpts / "epoch=1.ckpt")
    state = {"monitor": "val/acc", "best_model_path": inside, "last_model_path": f"local://{tmp_path}",
             "kth_best_model_path": "/etc/passwd", "best_k_models": {inside: 0.5, "s3://bucket/x.ckpt": 0.1,
                                                                     f"{ckpts}/../../other.ckpt": 0.2,
                                                                     "victims/notes.txt": 0.3},  # the cwd's
             "nested": {"file": "notes.txt", "steps": [1, 2]}, "dirpath": "/elsewhere"}
    kept, gone = confined(state, str(ckpts))
    assert kept == {"monitor": "val/acc", "best_model_path": inside, "last_model_path": "", "kth_best_model_path": "",
                    "best_k_models": {inside: 0.5}, "nested": {"file": "", "steps": [1, 2]}, "dirpath": "/elsewhere"}
    assert len(gone) == 6


def test_a_checkpoint_outside_the_run_is_never_removed(tmp_path):
    """Lightning removes the checkpoint a save replaces (last.ckpt's previous path, a top-k one no longer best):
    only a file of this run's checkpoint folder, whatever the path restored from a file says."""
    from types import SimpleNamespace

    from attnlab.callbacks import ModelCheckpoint

    ckpts, victim = tmp_path / "run" / "checkpoints", tmp_path / "victim"
    ckpts.mkdir(parents=True)
    victim.mkdir()
    (victim / "notes.txt").write_text("keep")
    (ckpts / "epoch=0.ckpt").write_text("old")
    callback = ModelCheckpoint(dirpath=str(ckpts))
    removed = []
    trainer = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(remove_checkpoint=removed.append))
    for path in (f"local://{victim}", str(victim), str(victim / "notes.txt"), f"{ckpts}/../../victim"):
        callback._remove_checkpoint(trainer, path)
    assert removed == [] and (victim / "notes.txt").read_text() == "keep"
    callback._remove_checkpoint(trainer, str(ckpts / "epoch=0.ckpt"))
    assert removed == [str(ckpts / "epoch=0.ckpt")]


def test_compare_shows_a_run_folders_text_as_text(tmp_path, monkeypatch):
    """A run folder's config.yaml is read as plain YAML (a resolver written with YAML's escape for `$` is never
    called), and its text is printed without control characters or Rich markup."""
    from rich.console import Console

    from attnlab.compare.cli import compare, show_diff

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-s3cret-never-shown")
    for i in range(2):
        run = tmp_path / "runs" / f"run\x1b[2J{i}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(
            f'model:\n  _target_: x.Task\n  note: "\\x24{{oc.env:AWS_SECRET_ACCESS_KEY}}{i}"\n'
            f'  link: "[link=file:///etc/passwd]click[/link]\\e]8;;file:///etc/passwd\\a{i}"\n')
        (run / "metrics.json").write_text(json.dumps({"val/acc": 0.5 + i / 10}))
        (run / "lineage.json").write_text(json.dumps({"host": f"h\x1b]0;title\x07{i}"}))
    import io

    out = io.StringIO()
    console = Console(file=out, width=250, force_terminal=False)
    compare([str(tmp_path / "runs")], console=console, report=tmp_path / "r.html")
    runs = sorted((tmp_path / "runs").iterdir())
    show_diff(str(runs[0]), str(runs[1]), console=console)
    shown = out.getvalue() + (tmp_path / "r.html").read_text()
    assert "aws-s3cret-never-shown" not in shown and "oc.env:AWS_SECRET_ACCESS_KEY" in shown
    assert "\x1b" not in shown and "\x07" not in shown
    assert "[link=file:///etc/passwd]click[/link]" in out.getvalue()  # shown as written, never a link


def test_a_run_folder_from_elsewhere_grants_nothing_and_copies_no_environment(tmp_path, monkeypatch, caplog):
    """--rerun: a folder naming what it builds at a key of its own or through task_name, or reading the
    environment, is refused; its lineage's text is shown without control characters."""
    import logging

    import yaml

    from attnlab.checkpoints import trust
    from attnlab.cli import rerun

    monkeypatch.setenv("DATABASE_URL", "postgres://user:pw@db/x")
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    folders = {
        "task_name": ({"task_name": "os.system", "model": {"net": "os.system", "command": "x"}},
                      r"names os\.system \(model\.net\)"),
        "environment": ({"task_name": "train", "tags": ["${oc.env:DATABASE_URL}"]},
                        r"reads the environment variable DATABASE_URL"),
    }
    try:
        for config, message in folders.values():
            (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
            rerun.overrides(run_dir, [])  # what train.py passes on to Hydra: task_name=<the folder's>
            with pytest.raises(UserError, match=message):
                rerun.config(run_dir, [f"task_name={config['task_name']}"], tmp_path / "out")
        (run_dir / "lineage.json").write_text(json.dumps({"python": "3.0\x1b]8;;http://x\x07"}))
        with caplog.at_level(logging.WARNING, logger="attnlab"):
            rerun.warn_lineage(run_dir)
        assert "rerun: python differs" in caplog.text and "\x1b" not in caplog.text and "\x07" not in caplog.text
    finally:
        trust.reset()
        rerun._run_dir, rerun._asked, rerun._given = None, [], None


def test_what_names_a_secret_and_where_its_value_goes(monkeypatch):
    from omegaconf import OmegaConf

    from attnlab import redact

    for key in ("api_key", "wandb_api_key", "githubToken", "AWS_SECRET_ACCESS_KEY", "hf_api_token", "github_token",
                "openai_api_key", "client-secret", "db_password", "github_pat", "token", "key"):
        assert redact.is_secret_key(key), key
    for key in ("pad_token", "cls_token", "max_tokens", "sort_key", "cache_key", "tokenizer", "sample_tokens",
                "monitor", "DATABASE_URL", "token_type_ids"):
        assert not redact.is_secret_key(key), key
    monkeypatch.setenv(redact.SECRET_ENV, "[]")  # restored when the test ends, as HF_API_TOKEN below
    monkeypatch.setenv("GITHUB_TOKEN", "gh-s3cret-1234")
    argv = ["+foo={token:dict-s3cret-1234,n:1}", "+hydra.job.env_set.HF_API_TOKEN=envset-s3cret-1234",
            "+notes=gh-s3cret-1234", "+bar={a:[1,2]}", "trainer.max_epochs=1"]
    assert redact.take_secret_overrides(argv) == ["+bar={a:[1,2]}", "trainer.max_epochs=1"]
    cfg = OmegaConf.create({"trainer": {"max_epochs": 1}})
    monkeypatch.setenv("HF_API_TOKEN", "")
    redact.restore(cfg)
    assert cfg.foo == {"token": "dict-s3cret-1234", "n": 1} and cfg.notes == "gh-s3cret-1234"
    assert os.environ["HF_API_TOKEN"] == "envset-s3cret-1234" and "hydra" not in cfg
    written = redact.redact(OmegaConf.to_container(cfg))
    assert "s3cret" not in json.dumps(written) and written["foo"]["n"] == 1


def test_a_moved_run_folders_own_paths_are_kept_in_their_new_place(tmp_path):
    """A run folder copied elsewhere continues there: its callback state's paths, under the old folder, are named in
    the new one before anything outside the run is dropped."""
    from attnlab.callbacks import ModelCheckpoint

    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    new.mkdir(parents=True)
    for name in ("last.ckpt", "epoch=1.ckpt"):
        (new / name).write_text("x")
    callback = ModelCheckpoint(dirpath=str(new), monitor="val/acc", save_last=True)
    best = str(old / "epoch=1.ckpt")
    state = {"dirpath": str(old), "last_model_path": str(old / "last.ckpt"), "best_model_path": best,
             "kth_best_model_path": best, "best_k_models": {best: torch.tensor(0.5)},
             "best_model_score": torch.tensor(0.5), "kth_value": torch.tensor(0.5), "monitor": "val/acc"}
    checkpoint = {"callbacks": {callback.state_key: state}}
    callback.on_load_checkpoint(None, None, checkpoint)
    callback.load_state_dict(checkpoint["callbacks"][callback.state_key])
    assert callback.last_model_path == str(new / "last.ckpt")
    assert list(callback.best_k_models) == [str(new / "epoch=1.ckpt")] == [callback.best_model_path]
