"""ImageNet-1k as people hold it: which layout a folder holds, and what its label files say.

Layouts, in the order they are looked for under `data.root` (the prepared tree may live elsewhere: `data.prepared`):

- **prepared**: `train/` and `val/` extracted from the archives by attnlab (`imagenet_prepare.py`), with
  `imagenet_prepared.json` (written last) naming the classes;
- **tree**: a `train/<wnid>/*.JPEG` and `val/<wnid>/*.JPEG` tree made some other way (valprep.sh, a copy);
- **archives**: image-net.org's `ILSVRC2012_img_train.tar` (one inner tar per class), `ILSVRC2012_img_val.tar`
  (50,000 loose files) and `ILSVRC2012_devkit_t12.tar.gz`: extracted once (`python -m attnlab.data.prepare imagenet`);
- **kaggle**: the Kaggle copy, `ILSVRC/Data/CLS-LOC/{train,val}` with `LOC_val_solution.csv` and
  `LOC_synset_mapping.txt`, read as it is (its `test/` holds unlabelled images: no test split).

The devkit: `data/meta.mat` holds 1,860 synsets; the 1,000 classes are its leaves (`num_children == 0`), each with an
ILSVRC2012_ID, a wnid, its words ("tench, Tinca tinca") and `num_train_images`; `data/ILSVRC2012_validation_ground_
truth.txt` gives one ILSVRC2012_ID per validation image in file order (IDs, not indices into sorted wnids). Class
indices follow the sorted wnids, as every ImageNet folder tree does.
"""

from __future__ import annotations

import csv
import io
import json
import re
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.errors import UserError

TRAIN_TAR, VAL_TAR, DEVKIT_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "ILSVRC2012_devkit_t12.tar.gz"
ARCHIVES = (TRAIN_TAR, VAL_TAR, DEVKIT_TAR)
MARKER = "imagenet_prepared.json"        # written last by a preparation: the tree beside it is whole
STAGING = ".imagenet_prepare"            # a preparation in progress (resumed from where it stopped)
KAGGLE_IMAGES = Path("ILSVRC/Data/CLS-LOC")
KAGGLE_VAL_CSV, KAGGLE_MAPPING = "LOC_val_solution.csv", "LOC_synset_mapping.txt"
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d+)")

MISSING = (
    "ImageNet-1k not found at {root}. Put there (or point data.root, or paths.data_dir / ATTNLAB_DATA_DIR, at) one "
    "of: (a) the three files from image-net.org as they come, " + ", ".join(ARCHIVES) + ", which attnlab extracts "
    "once, on first use or ahead with `python -m attnlab.data.prepare imagenet {root}` (about 150 GB more; "
    "data.prepared=<dir> puts the extracted tree elsewhere); (b) Kaggle's copy, the folder holding ILSVRC/Data/"
    "CLS-LOC/, " + KAGGLE_VAL_CSV + " and " + KAGGLE_MAPPING + "; (c) an extracted tree, train/<wnid>/*.JPEG and "
    "val/<wnid>/*.JPEG (the val images sorted into class folders); or (d) the Hugging Face copy with data.source=hf "
    "after accepting the terms of {hf_name} on the hub and running `huggingface-cli login` (about 150 GB is then "
    "downloaded into the HF cache on first use).{found}"
)


@dataclass(frozen=True)
class Synset:
    """One class of the devkit: its ILSVRC2012_ID, wnid, words, training images, and its parent's words."""
    ilsvrc_id: int
    wnid: str
    words: str
    num_train_images: int
    parent_words: str = ""


@dataclass
class Devkit:
    classes: list[Synset]            # the leaves, sorted by wnid: class index i is classes[i]
    val_ids: list[int]               # the ground truth: val image n (1-based) has ILSVRC2012_ID val_ids[n - 1]
    synsets: int = 0                 # every synset of meta.mat (1,860 in the real devkit)

    def wnid_of_id(self) -> dict[int, str]:
        return {s.ilsvrc_id: s.wnid for s in self.classes}

    def val_wnids(self) -> list[str]:
        """The wnid of each validation image, in file order."""
        by_id = self.wnid_of_id()
        unknown = sorted(set(self.val_ids) - set(by_id))
        if unknown:
            raise UserError(f"the devkit's validation ground truth names ILSVRC2012_IDs {unknown[:5]} that are not "
                            f"classes of its meta.mat: the devkit is damaged, download {DEVKIT_TAR} again.")
        return [by_id[i] for i in self.val_ids]

    @property
    def expected_train(self) -> int:
        return sum(s.num_train_images for s in self.classes)


def read_devkit(path: Path) -> Devkit:
    """meta.mat's leaves and the validation ground truth, read from the devkit archive without extracting it."""
    import numpy as np
    from scipy.io import loadmat

    try:
        with tarfile.open(path) as tar:
            files = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            wanted = ("meta.mat", "ILSVRC2012_validation_ground_truth.txt")
            absent = [name for name in wanted if name not in files]
            if absent:
                raise UserError(f"{path} holds no {' and no '.join(absent)}: it is not the ILSVRC2012 devkit "
                                f"(ILSVRC2012_devkit_t12/data/ holds both), or it is damaged; download it again.")
            meta = loadmat(io.BytesIO(tar.extractfile(files["meta.mat"]).read()), squeeze_me=True)
            truth = tar.extractfile(files["ILSVRC2012_validation_ground_truth.txt"]).read().split()
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        raise UserError(f"cannot read the devkit {path} ({type(e).__name__}: {e}): download it again.") from None
    if "synsets" not in meta:
        raise UserError(f"{path}'s meta.mat holds no `synsets` table: it is not the ILSVRC2012 devkit's.")
    rows = np.atleast_1d(meta["synsets"])
    ids = [int(r["ILSVRC2012_ID"]) for r in rows]
    words = {i: str(r["words"]) for i, r in zip(ids, rows)}
    parent: dict[int, int] = {}
    for i, r in zip(ids, rows):
        for child in np.atleast_1d(r["children"]).astype(int).tolist():
            parent.setdefault(int(child), i)
    leaves = [Synset(i, str(r["WNID"]), words[i], int(r["num_train_images"]), words.get(parent.get(i, -1), ""))
              for i, r in zip(ids, rows) if int(r["num_children"]) == 0]
    return Devkit(sorted(leaves, key=lambda s: s.wnid), [int(x) for x in truth], synsets=len(rows))


def _first(words: str) -> str:
    return words.split(",")[0].strip()


def display_names(classes: list[tuple[str, str, str]]) -> list[str]:
    """A short, unique name per class from (wnid, words, parent's words): the first of its words ("tench" for
    "tench, Tinca tinca"); a name that repeats ("crane" the bird and the machine) is told apart by its parent
    ("crane (wading bird)"), else by another of its words ("maillot (tank suit)"), else by its wnid."""
    names = [_first(words) or wnid for wnid, words, _ in classes]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        groups[name.casefold()].append(i)
    for idx in (g for g in groups.values() if len(g) > 1):
        first = {i: names[i] for i in idx}
        hints = [_first(classes[i][2]) for i in idx]
        if all(hints) and len({h.casefold() for h in hints}) == len(idx):
            for i, hint in zip(idx, hints):
                names[i] = f"{first[i]} ({hint})"
            continue
        for i in idx:
            others = [w.strip() for w in classes[i][1].split(",")[1:]
                      if w.strip() and w.strip().casefold() != first[i].casefold()]
            names[i] = f"{first[i]} ({others[0] if others else classes[i][0]})"
    counts = Counter(n.casefold() for n in names)
    return [f"{_first(classes[i][1]) or classes[i][0]} ({classes[i][0]})" if counts[n.casefold()] > 1 else n
            for i, n in enumerate(names)]


def read_mapping(path: Path) -> dict[str, str]:
    """LOC_synset_mapping.txt: `<wnid> <words>` per line -> {wnid: words}."""
    out = {}
    for line in path.read_text().splitlines():
        wnid, _, words = line.strip().partition(" ")
        if wnid:
            out[wnid] = words.strip()
    return out


def read_kaggle_val(path: Path) -> list[tuple[str, str]]:
    """LOC_val_solution.csv: (ImageId, wnid) per row, the wnid being the first word of PredictionString."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if rows and not {"ImageId", "PredictionString"} <= set(rows[0]):
        raise UserError(f"{path} has columns {sorted(rows[0])}, not ImageId and PredictionString: it is not Kaggle's "
                        "ImageNet validation solution file.")
    return [(r["ImageId"], r["PredictionString"].split()[0]) for r in rows if r.get("PredictionString", "").split()]


@dataclass
class Layout:
    """What a folder holds: `kind` (prepared | tree | archives | kaggle) and where its parts are."""
    kind: str
    root: Path
    out: Path                                   # where the prepared tree is (or goes)
    train: Path | None = None
    val: Path | None = None
    names: dict[str, str] = field(default_factory=dict)  # wnid -> display name, where the data names its classes

    @property
    def needs_preparation(self) -> bool:
        return self.kind == "archives"


def _names_beside(root: Path) -> dict[str, str]:
    """Class names for a tree made elsewhere, from a devkit or Kaggle's mapping lying beside it (else none)."""
    if (root / DEVKIT_TAR).is_file():
        kit = read_devkit(root / DEVKIT_TAR)
        return dict(zip((s.wnid for s in kit.classes),
                        display_names([(s.wnid, s.words, s.parent_words) for s in kit.classes])))
    if (root / KAGGLE_MAPPING).is_file():
        words = read_mapping(root / KAGGLE_MAPPING)
        return dict(zip(words, display_names([(w, t, "") for w, t in words.items()])))
    return {}


def read_marker(out: Path) -> dict:
    return json.loads((out / MARKER).read_text())


def find_layout(root: Path, prepared: Path | None = None, hf_name: str = "ILSVRC/imagenet-1k") -> Layout:
    """The layout at `root` (module docstring); the prepared tree is read from (and goes to) `prepared`, by default
    `root`. Nothing that fits: the paragraph saying what each layout needs and what of it was found."""
    out = Path(prepared or root)
    if (out / MARKER).is_file():
        names = {w: n for w, n, _ in read_marker(out)["classes"]}
        return Layout("prepared", root, out, out / "train", out / "val", names)
    has_archives = all((root / name).is_file() for name in ARCHIVES)
    stopped = next((t for t in dict.fromkeys((out, root)) if (t / STAGING).is_dir()), None)
    if stopped is not None:  # a preparation that stopped: resumed from the archives, never read half-done
        if has_archives:
            return Layout("archives", root, out)
        if any((root / name).is_file() for name in ARCHIVES):  # some of them: the paragraph naming what is missing
            raise UserError(MISSING.format(root=root, hf_name=hf_name, found=_found(root)))
        raise UserError(
            f"{stopped} holds an ImageNet-1k preparation that stopped before it finished ({stopped / STAGING} is "
            f"there, {stopped / MARKER} is not): its train/ and val/ are not whole, and are not read. Point data.root "
            f"at the folder that holds {', '.join(ARCHIVES)}, with data.prepared={stopped}: the preparation resumes "
            f"where it stopped (python -m attnlab.data.prepare imagenet <archives> --out {stopped}).")
    for tree in dict.fromkeys((out, root)):
        if (tree / "train").is_dir():
            val = tree / "val" if (tree / "val").is_dir() else None
            return Layout("tree", root, tree, tree / "train", val, _names_beside(root))
    if has_archives:
        return Layout("archives", root, out)
    kaggle = root / KAGGLE_IMAGES
    if (kaggle / "train").is_dir() and (root / KAGGLE_VAL_CSV).is_file():
        words = read_mapping(root / KAGGLE_MAPPING) if (root / KAGGLE_MAPPING).is_file() else {}
        names = dict(zip(words, display_names([(w, t, "") for w, t in words.items()])))
        return Layout("kaggle", root, out, kaggle / "train", kaggle / "val", names)
    raise UserError(MISSING.format(root=root, hf_name=hf_name, found=_found(root)))


def _found(root: Path) -> str:
    """What of a layout is there, for the paragraph of a folder that holds none whole."""
    if not root.is_dir():
        return ""
    parts = []
    archives = [name for name in ARCHIVES if (root / name).is_file()]
    if archives:
        parts.append(f"{root} holds {', '.join(archives)} but not "
                     f"{', '.join(n for n in ARCHIVES if n not in archives)}: all three are needed")
    if (root / KAGGLE_IMAGES).is_dir():
        absent = [str(p) for p in (root / KAGGLE_IMAGES / "train", root / KAGGLE_VAL_CSV) if not p.exists()]
        parts.append(f"{root} holds Kaggle's {KAGGLE_IMAGES} but not {', '.join(absent)}")
    if (root / "val").is_dir() and not (root / "train").is_dir():
        parts.append(f"{root} holds val/ but no train/")
    return (" Found: " + "; ".join(parts) + ".") if parts else ""
