"""A miniature ImageNet-1k in the formats people download it in, made on the spot (tiny images, five classes):

- image-net.org's: ILSVRC2012_img_train.tar (one inner <wnid>.tar per class), ILSVRC2012_img_val.tar (loose
  ILSVRC2012_val_<n>.JPEG) and ILSVRC2012_devkit_t12.tar.gz (data/meta.mat written with scipy, with non-leaf
  synsets and ILSVRC2012_IDs out of wnid order; data/ILSVRC2012_validation_ground_truth.txt of those IDs);
- Kaggle's: ILSVRC/Data/CLS-LOC/{train,val,test}, LOC_val_solution.csv and LOC_synset_mapping.txt.

ImageNet's known bad files are among them: a PNG named .JPEG and a CMYK JPEG. Two classes are named "crane" (a bird and
a machine) and two "maillot", as in the real set.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

# (ILSVRC2012_ID, wnid, words, parent id): leaves numbered out of wnid order, as in the real meta.mat
LEAVES = [
    (4, "n01440764", "tench, Tinca tinca", 8),
    (2, "n02012849", "crane", 6),
    (5, "n03126707", "crane", 7),
    (1, "n03710637", "maillot", 9),
    (3, "n03710721", "maillot, tank suit", 9),
]
INNER = [  # the non-leaf synsets: (id, wnid, words)
    (6, "n02000954", "wading bird, wader"),
    (7, "n03666917", "lifting device"),
    (8, "n02512053", "fish"),
    (9, "n04371563", "swimsuit, swimwear, bathing suit"),
    (10, "n00001740", "entity"),
]
WNIDS = sorted(w for _, w, _, _ in LEAVES)
NAMES = {"n01440764": "tench", "n02012849": "crane (wading bird)", "n03126707": "crane (lifting device)",
         "n03710637": "maillot (n03710637)", "n03710721": "maillot (tank suit)"}
PNG_AS_JPEG = "n01440764_2.JPEG"   # PNG bytes, as n02105855_2933.JPEG in the real set
CMYK = "n02012849_1.JPEG"          # a CMYK JPEG, as 22 training images of the real set


def jpeg(seed: int, size: int = 12, mode: str = "RGB", fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8"))
    buf = io.BytesIO()
    (img.convert(mode) if mode != "RGB" else img).save(buf, format=fmt)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def train_files(per_class: int) -> dict[str, dict[str, bytes]]:
    files = {}
    for c, wnid in enumerate(WNIDS):
        files[wnid] = {}
        for i in range(per_class):
            name = f"{wnid}_{i}.JPEG"
            mode, fmt = ("CMYK", "JPEG") if name == CMYK else ("RGB", "PNG") if name == PNG_AS_JPEG else ("RGB", "JPEG")
            files[wnid][name] = jpeg(100 * c + i, mode=mode, fmt=fmt)
    return files


def val_labels(per_class: int) -> list[str]:
    """The wnid of each validation image, in file order (classes interleaved, as in the real val tar)."""
    rng = np.random.default_rng(7)
    return [WNIDS[i] for i in rng.permutation(np.repeat(np.arange(len(WNIDS)), per_class))]


def meta_mat(counts: dict[str, int]) -> bytes:
    """meta.mat as the devkit's: a struct array `synsets` of leaves and non-leaves."""
    from scipy.io import savemat

    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images"]
    children: dict[int, list[int]] = {}
    for sid, _, _, parent in LEAVES:
        children.setdefault(parent, []).append(sid)
    children[10] = [6, 7, 8, 9]
    rows = [(sid, wnid, words, f"gloss of {words}", 0, np.zeros((1, 0)), 0, counts[wnid])
            for sid, wnid, words, _ in LEAVES]
    rows += [(sid, wnid, words, "", len(children[sid]), np.array(children[sid], dtype=np.uint16), 1, 0)
             for sid, wnid, words in INNER]
    table = np.zeros((1, len(rows)), dtype=[(f, object) for f in fields])
    for j, row in enumerate(rows):
        for f, value in zip(fields, row):
            table[0, j][f] = value
    buf = io.BytesIO()
    savemat(buf, {"synsets": table})
    return buf.getvalue()


def make_archives(root: Path, train_per_class: int = 4, val_per_class: int = 2, drop: str | None = None) -> Path:
    """The three ILSVRC2012 files in `root`; `drop`: a training image left out of its class's inner tar."""
    root.mkdir(parents=True, exist_ok=True)
    files = train_files(train_per_class)
    with tarfile.open(root / "ILSVRC2012_img_train.tar", "w") as outer:
        for wnid, images in files.items():
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for name, data in images.items():
                    if name != drop:
                        _add(inner, name, data)
            _add(outer, f"{wnid}.tar", buf.getvalue())
    labels = val_labels(val_per_class)
    with tarfile.open(root / "ILSVRC2012_img_val.tar", "w") as tar:
        for n, _ in enumerate(labels, 1):
            _add(tar, f"ILSVRC2012_val_{n:08d}.JPEG", jpeg(10_000 + n))
    ids = {wnid: sid for sid, wnid, _, _ in LEAVES}
    truth = "".join(f"{ids[w]}\n" for w in labels).encode()
    with tarfile.open(root / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as tar:
        _add(tar, "ILSVRC2012_devkit_t12/data/meta.mat", meta_mat({w: len(f) for w, f in files.items()}))
        _add(tar, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", truth)
        _add(tar, "ILSVRC2012_devkit_t12/readme.txt", b"devkit")
    return root


def make_kaggle(root: Path, train_per_class: int = 4, val_per_class: int = 2) -> Path:
    """Kaggle's layout in `root` (the competition folder)."""
    images = root / "ILSVRC" / "Data" / "CLS-LOC"
    for wnid, files in train_files(train_per_class).items():
        (images / "train" / wnid).mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (images / "train" / wnid / name).write_bytes(data)
    (images / "val").mkdir(parents=True, exist_ok=True)
    rows = ["ImageId,PredictionString"]
    for n, wnid in enumerate(val_labels(val_per_class), 1):
        image = f"ILSVRC2012_val_{n:08d}"
        (images / "val" / f"{image}.JPEG").write_bytes(jpeg(10_000 + n))
        rows.append(f"{image},{wnid} 1 2 30 40 {wnid} 5 6 70 80 ")
    (images / "test").mkdir(parents=True, exist_ok=True)
    (images / "test" / "ILSVRC2012_test_00000001.JPEG").write_bytes(jpeg(1))
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    words = {wnid: w for _, wnid, w, _ in LEAVES}
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{w} {words[w]}\n" for w in WNIDS))
    return root
