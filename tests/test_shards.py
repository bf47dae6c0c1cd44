"""Image folders as LitData shards (`python -m attnlab.data.prepare shards`, `data.format=shards`): the files' bytes
stored as they are in a seeded random order; each epoch split disjointly among 2 real processes (gloo) and their
workers, reshuffled per epoch by the seed; a mid-epoch resume from the state saved in a checkpoint (read with
weights_only=True) continues with exactly the samples left; a shard that unpickles is refused; train.py end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.errors import UserError
from conftest import FAST, compose_cfg

CLASSES = ("ant", "bee", "cat")


def _tree(root: Path, per_class: int = 14, size: int = 20) -> list[Path]:
    """JPEGs of noise, class c brighter than c - 1, under root/<class>/."""
    g = np.random.default_rng(0)
    files = []
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (g.random((size, size, 3)) * 80 + c * 80).astype("uint8")
            files.append(root / name / f"{i}.jpg")
            Image.fromarray(pixels).save(files[-1], quality=90)
    return files


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tree of 42 JPEGs converted with test_fraction=0 (train 38, val 4): (tree, shards, files)."""
    from attnlab.data.formats.shards import convert

    base = tmp_path_factory.mktemp("shards")
    files = _tree(base / "tree")
    convert(base / "tree", str(base / "shards"), test_fraction=0.0, seed=7, chunk_bytes="6KB", workers=1)
    return base / "tree", base / "shards", files


class Ident:
    """A transform that reads the encoded image: the CRC of its bytes, and one draw of the process's random state."""

    def from_bytes(self, data: bytes, mode: str):
        return torch.tensor([zlib.crc32(data), int(torch.randint(1 << 30, ()))])


def _loader(shards: Path, batch_size=4, workers=0, seed=3, epoch=None, world=1, rank=0):
    from attnlab.data.formats.shard_loader import train_loader
    from attnlab.data.formats.shard_format import read_meta

    size = read_meta(str(shards))["splits"]["train"]["samples"]
    return train_loader(str(shards / "train"), size, Ident(), batch_size=batch_size, num_workers=workers, seed=seed,
                        world=world, rank=rank, epoch=(lambda: epoch) if epoch is not None else (lambda: None))


def _epoch(loader, batches=None) -> list[list[int]]:
    """The CRCs of each batch (with their random draws: [[crc, draw], ...] per batch)."""
    out = []
    for x, _ in loader:
        out.append(x.tolist())
        if batches is not None and len(out) == batches:
            break
    return out


def test_the_conversion_stores_the_files_bytes_in_a_seeded_random_order(converted, tmp_path):
    from attnlab.data.formats.shard_loader import streaming_dataset
    from attnlab.data.formats.shards import META, convert

    tree, shards, files = converted
    meta = json.loads((shards / META).read_text())
    assert meta["class_names"] == list(CLASSES) and meta["test_is_validation"]
    assert {k: v["samples"] for k, v in meta["splits"].items()} == {"train": 38, "val": 4}
    assert meta["splits"]["train"]["chunks"] > 4  # several chunks of about 6 KB
    index = json.loads((shards / "train" / "index.json").read_text())
    assert index["config"]["data_format"] == ["bytes", "int"]
    stored = [(bytes(data), label) for split in ("train", "val") for data, label in
              (streaming_dataset(str(shards / split))[i] for i in range(meta["splits"][split]["samples"]))]
    by_bytes = {f.read_bytes(): CLASSES.index(f.parent.name) for f in files}
    assert sorted(stored) == sorted(by_bytes.items())  # every file once, its bytes as they are, its class
    labels = [label for _, label in stored[:38]]
    assert labels != sorted(labels)  # not the tree's order by class

    def train_order(seed, out):
        convert(tree, str(out), test_fraction=0.0, seed=seed, chunk_bytes="6KB", workers=2)
        return [bytes(streaming_dataset(str(out / "train"))[i][0]) for i in range(38)]

    again = train_order(7, tmp_path / "again")
    assert again == [b for b, _ in stored[:38]]  # the same seed, the same shards (also with 2 writers)
    assert train_order(8, tmp_path / "other") != again
    with pytest.raises(UserError, match="already holds converted shards"):
        convert(tree, str(tmp_path / "again"))


def test_epochs_are_reshuffled_by_the_seed_and_the_run_s_epoch(converted):
    _, shards, _ = converted
    epochs = [_epoch(_loader(shards, epoch=e)) for e in range(3)]
    crcs = [[s[0] for b in e for s in b] for e in epochs]
    assert all(len(c) == len(set(c)) == 36 for c in crcs)  # 38 samples, batches of 4: 2 left out
    assert crcs[0] != crcs[1] != crcs[2] and len(set().union(*crcs)) == 38  # another order, others left out
    assert [s[0] for b in _epoch(_loader(shards, epoch=1)) for s in b] == crcs[1]  # the same seed and epoch
    assert [s[0] for b in _epoch(_loader(shards, epoch=1, seed=4)) for s in b] != crcs[1]  # another seed


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mid_epoch_resume_from_the_checkpointed_state_continues_with_the_samples_left(converted, workers, tmp_path,
                                                                                     caplog):
    _, shards, _ = converted
    torch.manual_seed(0)
    whole = _epoch(_loader(shards, workers=workers, epoch=2))
    torch.manual_seed(0)
    loader = _loader(shards, workers=workers, epoch=2)
    begun = _epoch(loader, batches=3)
    torch.save({"loader": loader.state_dict()}, tmp_path / "state.pt")
    torch.manual_seed(123)  # a new process: another random state
    state = torch.load(tmp_path / "state.pt", weights_only=True)["loader"]  # plain containers only
    resumed = _loader(shards, workers=workers, epoch=None)
    resumed.load_state_dict(state)
    rest = _epoch(resumed)
    crc = [[s[0] for s in b] for b in whole]
    assert begun[:3] and [[s[0] for s in b] for b in begun + rest] == crc  # exactly the samples left, in order
    if workers == 0:  # and the same random draws (workers draw their own)
        assert begun + rest == whole
    assert [[s[0] for s in b] for b in _epoch(resumed)] != crc  # then the next epoch
    # another batch size: the epoch restarts, and the log says so
    other = _loader(shards, batch_size=2, workers=workers, epoch=2)
    other.load_state_dict(state)
    assert len([s for b in _epoch(other) for s in b]) == 38 and "restarts from its first batch" in caplog.text


RANK = """
import json, zlib
import torch, torch.distributed as dist
from attnlab.data.formats.shard_loader import train_loader

class Ident:
    def from_bytes(self, data, mode):
        return zlib.crc32(data)

dist.init_process_group("gloo")
epochs = []
for e in range(2):
    loader = train_loader({train!r}, 38, Ident(), batch_size=3, num_workers=2, seed=3, world=dist.get_world_size(),
                          rank=dist.get_rank(), epoch=lambda: e)
    epochs.append([int(i) for x, _ in loader for i in x])
print(json.dumps(epochs))
dist.destroy_process_group()
"""


def test_two_processes_read_disjoint_parts_of_each_epoch(converted):
    """Two real processes (gloo), each with 2 loader workers and batches of 3: each epoch they read disjoint samples,
    all but 38 mod (2 x 3) = 2 of them, in another order each epoch."""
    _, shards, _ = converted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = RANK.format(train=str(shards / "train"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": str(port)}) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    rank0, rank1 = (json.loads(o[0].strip().splitlines()[-1]) for o in outs)
    for e in range(2):
        assert len(rank0[e]) == len(rank1[e]) == 18 and not set(rank0[e]) & set(rank1[e])
    assert rank0[0] != rank0[1]
    assert all(len(set(rank0[e]) | set(rank1[e])) == 36 for e in range(2))


def test_the_window_shuffle_of_parallel_file_systems_keeps_ranks_disjoint(converted, monkeypatch):
    """On NFS, Lustre or GPFS LitData reads chunks in place and shuffles within a window of them (forced here)."""
    _, shards, _ = converted
    monkeypatch.setenv("LITDATA_POSIX_FAST", "1")
    epochs = [[[s[0] for b in _epoch(_loader(shards, batch_size=3, epoch=e, world=2, rank=r)) for s in b]
               for r in range(2)] for e in range(2)]
    for rank0, rank1 in epochs:
        assert rank0 and rank1 and not set(rank0) & set(rank1) and len(rank0) == len(rank1)
    assert epochs[0][0] != epochs[1][0]


def test_a_shard_whose_samples_unpickle_is_refused(tmp_path):
    from litdata import optimize

    from attnlab.data.images.imagefolder import ImageFolderDataModule
    from attnlab.data.formats.shard_loader import streaming_dataset
    from attnlab.data.formats.shards import META

    out = tmp_path / "shards"
    optimize(fn=_pickled_sample, inputs=list(range(4)), output_dir=str(out / "train"), chunk_bytes="1KB",
             num_workers=1, mode="overwrite", verbose=False, start_method="fork")
    assert "pickle" in json.loads((out / "train" / "index.json").read_text())["config"]["data_format"]
    (out / META).write_text(json.dumps({"class_names": list(CLASSES), "splits": {"train": {"samples": 4}}}))
    with pytest.raises(UserError, match=r"`pickle` format, which is read by unpickling.*does not read it"):
        ImageFolderDataModule(root=str(out), format="shards")
    with pytest.raises(UserError, match="read by unpickling"):  # also read without the index's check (a URL)
        streaming_dataset(str(out / "train"))[0]


class _Opaque:
    def __init__(self, i):
        self.i = i


def _pickled_sample(i):
    return b"\xff\xd8", _Opaque(i)


def test_a_folder_without_shards_says_how_to_make_them(tmp_path):
    from attnlab.data.images.imagefolder import ImageFolderDataModule

    _tree(tmp_path / "tree", per_class=2)
    with pytest.raises(UserError, match="python -m attnlab.data.prepare shards <image folder>"):
        ImageFolderDataModule(root=str(tmp_path / "tree"), format="shards")
    with pytest.raises(UserError, match="data.format=tar is not known"):
        ImageFolderDataModule(root=str(tmp_path / "tree"), format="tar")


def test_train_py_on_shards_resumes_its_epoch_from_the_checkpoint(converted, tmp_path):
    """`python train.py data=imagefolder data.format=shards data.root=<shards>` trains and tests; its
    checkpoint, written mid-epoch and read with weights_only=True, holds the loader's position, from which the
    training loader continues with exactly the batches that an uninterrupted epoch has left."""
    from attnlab.cli.training import train
    from attnlab.data.images.imagefolder import ImageFolderDataModule

    _, shards, _ = converted
    data = ["data=imagefolder", "data.format=shards", f"data.root={shards}", "data.image_size=16",
            "data.batch_size=4", "data.num_workers=0", "data.augment=null"]
    run = tmp_path / "run"
    train(compose_cfg([*data, "trainer.max_steps=3", "trainer.limit_val_batches=1", "test=true", *FAST], run))
    metrics = json.loads((run / "metrics.json").read_text())
    assert "test/acc" in metrics and metrics["test_is_validation"]  # converted with test_fraction=0
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["global_step"] == 3
    state = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]

    def loader():
        dm = ImageFolderDataModule(root=str(shards), format="shards", image_size=16, batch_size=4, seed=42,
                                   augment=None)
        dm.setup()
        return dm.train_dataloader()

    whole = [x for x, _ in loader()]
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed]
    assert len(whole) == 9 and len(rest) == 6 and all(torch.equal(a, b) for a, b in zip(whole[3:], rest))


class KillAtStep:
    """A callback that SIGKILLs its process at the start of training step `step`, once (its marker file)."""

    def __new__(cls, step: int, marker: str):
        import lightning as L

        class _Kill(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if trainer.global_step == step and not Path(marker).exists():
                    Path(marker).touch()
                    os.kill(os.getpid(), 9)

        return _Kill()


@pytest.mark.slow
def test_a_run_on_shards_killed_mid_epoch_continues_exactly(converted, tmp_path):
    """SIGKILL mid-epoch of `python train.py data.format=shards` with 2 loader workers, after a step save, then the same
    command into the same folder: it resumes from that step with the samples its epoch had left, and ends with the
    numbers of an uninterrupted run."""
    _, shards, _ = converted
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "PYTHONUNBUFFERED": "1",
                        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "train.py", "data=imagefolder", "data.format=shards", f"data.root={shards}",
            "data.image_size=16", "data.batch_size=4", "data.num_workers=2", "data.augment=null", "trainer.max_epochs=2",
            "callbacks.model_checkpoint.every_n_train_steps=3", *FAST]
    kill = ["+callbacks.kill._target_=test_shards.KillAtStep", "+callbacks.kill.step=13",
            f"+callbacks.kill.marker={tmp_path / 'killed'}"]  # epoch 2 (9 steps each), after the save at step 12

    def run(folder, *extra):
        return subprocess.run([*args, *extra, f"hydra.run.dir={folder}"], cwd=Path(__file__).parents[1], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stdout[-3000:]
    killed = run(tmp_path / "killed_run", *kill)
    assert killed.returncode == -9 and (tmp_path / "killed").exists(), killed.stdout[-3000:]
    assert torch.load(tmp_path / "killed_run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 12
    resumed = run(tmp_path / "killed_run", *kill)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, resumed.stdout[-3000:]
    one, two = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "killed_run"))
    for key in ("val/loss", "val/acc", "test/loss", "test/acc", "train/loss_epoch"):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key


class RecordSamples:
    """A callback that writes, per rank, a fingerprint of each training image per epoch to <folder>/rank<r>.json."""

    def __new__(cls, folder: str):
        import lightning as L

        class _Record(L.Callback):
            seen: dict = {}

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                images = batch[0].reshape(len(batch[0]), -1).to(torch.float64)
                prints = (images * torch.arange(1, images.shape[1] + 1, dtype=torch.float64)).sum(1).tolist()
                self.seen.setdefault(str(trainer.current_epoch), []).extend(prints)

            def on_train_end(self, trainer, pl_module):
                Path(folder, f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))

        return _Record()


@pytest.mark.slow
def test_ddp_on_shards_gives_each_rank_its_own_samples(converted, tmp_path):
    """`python train.py trainer=ddp_cpu data.format=shards`: the 2 ranks train on disjoint images each epoch, all but
    38 mod (2 x 4) = 6 of them, in another order the next epoch."""
    _, shards, _ = converted
    env = os.environ | {"ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "PYTHONUNBUFFERED": "1",
                        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "train.py", "trainer=ddp_cpu", "data=imagefolder", "data.format=shards",
                       f"data.root={shards}", "data.image_size=16", "data.batch_size=4", "data.num_workers=1",
                       "data.augment=null", "trainer.max_epochs=2", "test=false", *FAST,
                       "+callbacks.record._target_=test_shards.RecordSamples", f"+callbacks.record.folder={tmp_path}",
                       f"hydra.run.dir={tmp_path / 'run'}"], cwd=Path(__file__).parents[1], env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in ("0", "1"):
        a, b = ranks[0][epoch], ranks[1][epoch]
        assert len(a) == len(b) == 16 and len(set(a) | set(b)) == 32  # disjoint, 38 - 6 images
    assert ranks[0]["0"] != ranks[0]["1"]
