"""`make data` (attnlab.data.fetch) against a local HTTP server that serves small files in the real formats at the
real URLs' paths: what it lays out must load with attnlab's own DataModules, through the data configs."""

from __future__ import annotations

import csv
import gzip
import hashlib
import http.server
import io
import pickle
import socket
import tarfile
import threading
import zipfile
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import numpy as np
import pytest
from omegaconf import open_dict
from PIL import Image

from attnlab.cli.builders import build_datamodule
from attnlab.data import fetch as F
from attnlab.errors import UserError
from conftest import compose_cfg, real_data

RNG = np.random.default_rng(0)
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _idx(array: np.ndarray) -> bytes:
    """An IDX file (uint8): magic 0x0000 08 <ndim>, the big-endian dimensions, the data."""
    head = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return head + array.astype(np.uint8).tobytes()


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array.astype(np.uint8), mode="L").save(buf, format="PNG")
    return buf.getvalue()


def _cifar_tarball(per_batch: int = 10) -> bytes:
    """cifar-10-python.tar.gz in miniature: the real member names and pickle layout, `per_batch` images a batch."""
    def batch(label: str) -> bytes:
        labels = [i % 10 for i in range(per_batch)]
        data = RNG.integers(0, 256, (per_batch, 3 * 32 * 32), dtype=np.uint8)
        names = [f"{CIFAR_CLASSES[y]}_s_{i:06d}.png" for i, y in enumerate(labels)]
        return pickle.dumps({"batch_label": label, "labels": labels, "data": data, "filenames": names}, protocol=2)

    members = {f"data_batch_{i}": batch(f"training batch {i} of 5") for i in range(1, 6)}
    members |= {"test_batch": batch("testing batch 1 of 1"), "readme.html": b"<html></html>",
                "batches.meta": pickle.dumps({"num_cases_per_batch": per_batch, "label_names": CIFAR_CLASSES,
                                              "num_vis": 3072}, protocol=2)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _fixture(name: str, dest: str) -> bytes:
    """Small stand-in, in the real format, for the file `dest` of dataset `name`."""
    if name == "tinyshakespeare":
        return b"First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 30
    if name == "wikitext2":
        return b" = Valkyria Chronicles = \n \n the game began development in 2010 , carrying over <unk> .\n" * 40
    if name == "multi30k":
        n = 30 if dest.startswith("train") else 5
        line = "zwei junge männer sind im freien ." if ".de." in dest else "two young men are outside ."
        return _gz("".join(f"{line} {i}\n" for i in range(n)).encode())
    if name == "mnist":
        n = 40 if dest.startswith("train") else 10
        array = RNG.integers(0, 256, (n, 28, 28)) if "images" in dest else np.arange(n) % 10
        return _gz(_idx(array))
    if name == "cifar10":
        return _cifar_tarball()
    if name == "isbi2012_em_membrane":
        if dest.startswith("image/"):
            return _png(RNG.integers(0, 256, (32, 32)))
        return _png(np.where(RNG.random((32, 32)) < 0.2, 0, 255))
    if name == "sst2":
        return b"sentence\tlabel\n" + b"it 's a charming and often affecting journey . \t1\nbleak \t0\n" * 3
    raise AssertionError(f"no fixture for {name}/{dest}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A local server holding a fixture at each real URL's path, and the real manifest pointed at it."""
    root = tmp_path_factory.mktemp("www")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    manifest = {}
    for name, files in F.MANIFEST.items():
        manifest[name] = []
        for f in files:
            data = _fixture(name, f.dest or f.name)
            path = urlsplit(f.url).path
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.lstrip("/")).write_bytes(data)
            manifest[name].append(replace(f, url=base + path, sha256=_sha(data)))
    yield SimpleNamespace(manifest=manifest, root=root, base=base)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def fetched(served, tmp_path_factory):
    """Every dataset fetched once from the local server."""
    data_dir = tmp_path_factory.mktemp("fetched") / "data"
    lines: list[str] = []
    F.fetch(data_dir=data_dir, manifest=served.manifest, say=lines.append)
    return data_dir, lines


def _dead_url() -> str:
    """A URL on a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _offline(manifest: dict) -> dict:
    """The same manifest with every URL on a closed port."""
    dead = _dead_url()
    return {n: [replace(f, url=dead + urlsplit(f.url).path) for f in files] for n, files in manifest.items()}


def _datamodule(tmp_path: Path, data_dir: Path, overrides: list[str]):
    cfg = compose_cfg(overrides, tmp_path)
    with open_dict(cfg):
        cfg.paths.data_dir = str(data_dir)
        cfg.data.num_workers = 0
    return build_datamodule(cfg.data)


def test_fetch_reports_each_dataset_and_marks_it_complete(fetched):
    data_dir, lines = fetched
    assert sorted(p.name for p in data_dir.iterdir()) == sorted(F.MANIFEST)  # no staging folder left
    for name, files in F.MANIFEST.items():
        assert any(line.startswith(f"{name}: fetched into {data_dir / name}") for line in lines)
        sums = F.verify_folder(data_dir / name)
        assert sums is not None and not sums[1]
        assert sorted(sums[0]) == sorted(o for f in files for o in f.outputs)
    assert not (data_dir / "cifar10" / "cifar-10-python.tar.gz").exists()  # the archive is not kept


def test_text_datasets_load_through_their_configs(fetched, tmp_path):
    data_dir, _ = fetched
    dm = _datamodule(tmp_path, data_dir, ["data=tinyshakespeare", "model=gpt_char", "data.block_size=16",
                                          "data.batch_size=4"])
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 16) and dm.info().vocab_size > 20
    dm = _datamodule(tmp_path, data_dir, ["data=wikitext2", "model=gpt_char", "data.tokenizer=char",
                                          "data.block_size=16", "data.batch_size=4"])
    assert next(iter(dm.val_dataloader()))[0].shape[1] == 16
    dm = _datamodule(tmp_path, data_dir, ["data=multi30k", "model=transformer_seq2seq_small", "data.download=false",
                                          "data.batch_size=4"])
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (30, 5, 5)
    with open(data_dir / "sst2" / "train.tsv", newline="") as f:  # no loader yet: the TSV as GLUE lays it out
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 6 and {r["label"] for r in rows} == {"0", "1"}


def test_image_datasets_load_through_their_configs(fetched, tmp_path):
    data_dir, _ = fetched
    dm = _datamodule(tmp_path, data_dir, ["data=cifar10", "model=vit_tiny", "data.batch_size=5"])
    assert dm.class_names == CIFAR_CLASSES  # read from batches.meta of cifar-10-batches-py
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (45, 5, 10)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (5, 3, 32, 32)
    dm = _datamodule(tmp_path, data_dir, ["data=mnist", "model=vit_tiny", "data.batch_size=4"])
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (36, 4, 10)  # the official train/test split
    assert next(iter(dm.train_dataloader()))[0].shape == (4, 1, 28, 28)
    dm = _datamodule(tmp_path, data_dir, ["data=membrane", "model=unet", "data.image_size=16", "data.batch_size=2",
                                          "data.samples_per_epoch=4"])
    assert (len(dm.train_set), len(dm.val_set)) == (4, 5)  # 4 crops of the 25 training slices; slices 25-29
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 1, 16, 16) and set(masks.unique().tolist()) == {0, 1}


def test_second_run_skips_what_is_complete_and_refetches_what_changed(served, tmp_path):
    manifest = served.manifest
    data_dir = tmp_path / "data"
    F.fetch(["tinyshakespeare", "mnist"], data_dir, manifest=manifest, say=lambda _: None)
    lines: list[str] = []
    F.fetch(["tinyshakespeare", "mnist"], data_dir, manifest=_offline(manifest), say=lines.append)  # no network
    assert lines == [f"tinyshakespeare: complete in {data_dir / 'tinyshakespeare'} (1 file matches its SHA256SUMS)",
                     f"mnist: complete in {data_dir / 'mnist'} (4 files match its SHA256SUMS)"]
    (data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"truncated")
    lines.clear()
    F.fetch(["mnist"], data_dir, manifest=manifest, say=lines.append)
    assert "t10k-labels-idx1-ubyte.gz" in lines[0] and "missing or changed" in lines[0]
    assert lines[-1].startswith("mnist: fetched into") and not F.verify_folder(data_dir / "mnist")[1]


def test_sha256_mismatch_names_dataset_and_url_and_leaves_nothing(served, tmp_path):
    manifest, root = served.manifest, served.root
    files = list(manifest["mnist"])
    files[2] = replace(files[2], sha256="0" * 64)
    with pytest.raises(UserError) as err:
        F.fetch(["mnist"], tmp_path / "data", manifest={"mnist": files}, say=lambda _: None)
    msg = str(err.value)
    assert msg.startswith("mnist: the file downloaded from " + files[2].url)
    served_sha = _sha((root / urlsplit(files[2].url).path.lstrip("/")).read_bytes())
    assert f"has sha256 {served_sha}, but {'0' * 64} was expected" in msg and "nothing of mnist was written" in msg
    assert list((tmp_path / "data").iterdir()) == []  # not even the two files verified before it


def test_unreachable_url_is_a_clear_error_and_a_file_put_by_hand_is_used(served, tmp_path, monkeypatch, capsys):
    manifest, root = served.manifest, served.root
    monkeypatch.setattr(F, "MANIFEST", _offline(manifest))
    data_dir = tmp_path / "data"
    with pytest.raises(SystemExit) as exit_:
        F.main(["tinyshakespeare", "--data-dir", str(data_dir)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    url = F.MANIFEST["tinyshakespeare"][0].url
    by_hand = data_dir / "tinyshakespeare" / "input.txt"
    assert err.startswith(f"attnlab: error: could not download tinyshakespeare from {url} (")
    assert "Connection refused" in err and "proxy" in err and f"put it at {by_hand}," in err
    assert not data_dir.exists() or not any(data_dir.iterdir())  # no staging folder, no dataset folder
    by_hand.parent.mkdir(parents=True)
    by_hand.write_bytes((root / urlsplit(url).path.lstrip("/")).read_bytes())
    F.main(["tinyshakespeare", "--data-dir", str(data_dir)])  # still offline: checks the file and marks it complete
    assert "1 already in place, not downloaded" in capsys.readouterr().out
    assert not F.verify_folder(data_dir / "tinyshakespeare")[1]


def test_zip_members_and_gunzipped_files_are_laid_out(served, tmp_path):
    root, base = served.root, served.base
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("pack/a.txt", "alpha\n")
        zf.writestr("pack/skip.txt", "not wanted\n")
    (root / "toy").mkdir(exist_ok=True)
    (root / "toy" / "pack.zip").write_bytes(buf.getvalue())
    (root / "toy" / "b.txt.gz").write_bytes(_gz(b"beta\n"))
    toy = [F.File(f"{base}/toy/pack.zip", _sha(buf.getvalue()), unpack="zip", members={"pack/a.txt": "a/a.txt"}),
           F.File(f"{base}/toy/b.txt.gz", _sha(_gz(b"beta\n")), "b.txt", unpack="gunzip")]
    F.fetch(data_dir=tmp_path, manifest={"toy": toy}, say=lambda _: None)
    assert (tmp_path / "toy" / "a" / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "toy" / "b.txt").read_text() == "beta\n"
    assert sorted(F.verify_folder(tmp_path / "toy")[0]) == ["a/a.txt", "b.txt"]
    assert not (tmp_path / "toy" / "pack.zip").exists() and not (tmp_path / "toy" / "skip.txt").exists()


def test_read_only_data_dir_is_verified_never_written(served, tmp_path):
    manifest = served.manifest
    data_dir = tmp_path / "data"
    F.fetch(["tinyshakespeare"], data_dir, manifest=manifest, say=lambda _: None)
    data_dir.chmod(0o555)
    (data_dir / "tinyshakespeare").chmod(0o555)
    try:
        lines: list[str] = []
        F.fetch(["tinyshakespeare"], data_dir, manifest=manifest, say=lines.append)
        assert lines[0].startswith("tinyshakespeare: complete in")
        with pytest.raises(UserError, match=r"sst2: it is not complete there, but .*data is read-only"):
            F.fetch(["sst2"], data_dir, manifest=manifest, say=lambda _: None)
        with pytest.raises(UserError, match=r"--force fetches it again, but .*tinyshakespeare is read-only"):
            F.fetch(["tinyshakespeare"], data_dir, force=True, manifest=manifest, say=lambda _: None)
        assert sorted(p.name for p in data_dir.iterdir()) == ["tinyshakespeare"]
    finally:
        (data_dir / "tinyshakespeare").chmod(0o755)
        data_dir.chmod(0o755)


# the offline copy re-gzipped MNIST's test files (its README says so): same images, other .gz bytes
REGZIPPED = {"mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz"}


def test_real_manifest_hashes_match_the_offline_copies():
    """Catches a typo in a hash: every file the offline copy holds byte for byte must have the manifest's sha256."""
    compared = 0
    for name, files in F.MANIFEST.items():
        folder = real_data(name)
        for f in files:
            path = folder / f.dest
            if f.unpack is None and path.is_file() and f"{name}/{f.dest}" not in REGZIPPED:
                assert F.sha256_of(path) == f.sha256, f"{name}/{f.dest}: manifest sha256 differs from {path}"
                compared += 1
    assert compared == 1 + 2 + 6 + 60 + 3  # tinyshakespeare, wikitext2 valid/test, multi30k, membranes, sst2
