"""Small datasets in the real formats, made on the spot: the tests need no network and no ../shared.

`small_data` is a data folder laid out like ../shared/data (and like `make data`'s ./data), with a small made-up
copy of each dataset the tests read:

    tinyshakespeare/input.txt                      ~730 lines (21 kB) of play-like text in Tiny Shakespeare's 65 chars
    multi30k/{train,val,test_2016_flickr}.{de,en}.gz   1200 / 64 / 64 German-English captions, line-aligned, gzipped
    mnist/t10k-{images-idx3,labels-idx1}-ubyte.gz  IDX files of 300 28x28 digits (a test set only, as the offline copy)
    cifar10/cifar10_test.zip, cifar10_train_subset_20_per_class.zip   32x32 RGB PNGs as <split>/<class>/*.png
    isbi2012_em_membrane/{image,label}/<0..29>.png 30 grayscale 256x256 slices, masks 255 cell / 0 membrane
    wikitext2/{valid,test}.txt                     WikiText-style tokenized text (no train.txt, as the offline copy)
    sst2/{train,dev,test}.tsv                      400 / 80 / 80 labelled sentences, a sentiment word decides the label

Point `paths.data_dir` (compose_cfg(..., data_dir=small_data)) or ATTNLAB_DATA_DIR (run_cli(..., data_dir=small_data))
at it.
The builders (make_*) also make variants in a test's own folder, e.g. MNIST as plain IDX files with a train set.
Tests of learning on the real data read ATTNLAB_DATA_DIR through conftest.real_data instead.
"""

from __future__ import annotations

import gzip
import io
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# ---- text: a short play-like corpus

# Tiny Shakespeare's 65 characters (its one '$' is a typo in "sha$l", its '3' from "3 KING HENRY VI" headings)
SHAKESPEARE_CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

_OPENING = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

Senators, &C:
Zounds! what noise is this? Hold, hold, the people come.

3 KING HENRY VI

QUEEN MARGARET:
Now stops thy spring; my sea sha$l suck them dry,
And in thy quarrel quickly join the Dukes of York and Exeter.

"""

_SPEAKERS = ["ROMEO", "JULIET", "Nurse", "MERCUTIO", "BENVOLIO", "LADY CAPULET", "FRIAR LAURENCE", "GLOUCESTER",
             "KING RICHARD III", "QUEEN ELIZABETH", "BUCKINGHAM", "CLARENCE", "DUKE VINCENTIO", "ISABELLA", "LUCIO",
             "PETRUCHIO", "KATHARINA", "POLIXENES", "AUTOLYCUS", "WARWICK", "YORK", "MENENIUS", "First Citizen",
             "Second Citizen", "Provost", "Servant", "All"]
_OPENERS = ["O", "Nay", "Ay", "Why", "Good my lord", "Alas", "What", "Come", "Peace", "Marry", "Fie", "Hark",
            "Sweet", "Well", "Now", "Then", "Go to", "I pray you", "By my troth", "Zounds"]
_CLAUSES = [
    "thou art a villain and a knave", "the king is come to London", "my heart is heavy with this news",
    "I will not stay to hear thee", "let us go in together", "the night is long that never finds the day",
    "what light through yonder window breaks", "he speaks like one that knows not what he says",
    "I do beseech your grace to pardon me", "there is no more to say", "the queen hath sent for you",
    "her father's house is just beyond the wall", "my sword shall vex the proudest of them all",
    "so quickly may one catch the plague", "the people love him not", "'tis but thy name that is my enemy",
    "o'er the hills the morning comes", "I prithee, tell me what thou know'st", "we must be patient",
    "his honour is a jewel of great price", "the duke hath given his word", "bring me word again",
    "it is the east, and Juliet is the sun", "a plague o' both your houses", "give me thy hand",
    "the gentle lady weeps", "I have done the deed", "this day shall gentle his condition",
    "my lord of Gloucester waits without", "the zeal of thy good heart", "a kingdom for a horse",
    "I'll follow thee and make a heaven of hell", "the time is out of joint", "we few, we happy few",
    "be not afraid of greatness", "the quality of mercy is not strain'd", "how now, what news",
    "they say he is a gentle friend", "speak low, if you speak love", "the lazy hours go slowly by",
]
_ENDS = [".", ".", ".", "!", "?", ";", ":", ","]


def shakespeare_text(seed: int = 0, speeches: int = 160) -> str:
    """A play-like text with exactly Tiny Shakespeare's 65 characters (~730 lines, 21 kB): speaker lines
    ("ROMEO:"), a few lines of verse each, speeches separated by blank lines."""
    rng = random.Random(seed)
    out = [_OPENING]
    for _ in range(speeches):
        lines = []
        for _ in range(rng.randint(1, 4)):
            line = rng.choice(_CLAUSES)
            if rng.random() < 0.4:
                line = f"{rng.choice(_OPENERS)}, {line}"
            if rng.random() < 0.3:
                line += ", " + rng.choice(_CLAUSES)
            line = line[0].upper() + line[1:]
            if rng.random() < 0.1:
                line += "--" + rng.choice(_CLAUSES)
            lines.append(line)
        ends = [rng.choice(_ENDS) for _ in lines[:-1]] + [rng.choice([".", ".", "!", "?"])]
        lines = [line + end for line, end in zip(lines, ends)]
        out.append(f"{rng.choice(_SPEAKERS)}:\n" + "\n".join(lines) + "\n\n")
    text = "".join(out)
    assert "".join(sorted(set(text))) == SHAKESPEARE_CHARS
    return text


def make_tinyshakespeare(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "input.txt").write_text(shakespeare_text())
    return root


def make_wikitext2(root: Path) -> Path:
    """valid.txt and test.txt in WikiText's tokenized layout (" = Title = " headings, spaced punctuation); no
    train.txt, like the offline copy."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    for name in ("valid", "test"):
        parts = []
        for t in range(5):
            parts.append(f" \n = Article {name} {t} = \n \n")
            for _ in range(4):
                sent = " ".join(rng.choice(_CLAUSES) + " ," for _ in range(3)).rstrip(" ,")
                parts.append(f" {sent[0].upper()}{sent[1:]} . It was the <unk> of @-@ {rng.randint(1, 99)} . \n")
        (root / f"{name}.txt").write_text("".join(parts))
    return root


# ---- parallel text: Multi30k-like captions

_SUBJECTS = [  # German, English, plural
    ("Ein Mann", "A man", False), ("Eine Frau", "A woman", False), ("Ein kleines Mädchen", "A little girl", False),
    ("Ein Junge", "A boy", False), ("Ein Hund", "A dog", False), ("Ein älterer Mann", "An older man", False),
    ("Eine junge Frau", "A young woman", False), ("Ein Kind", "A child", False),
    ("Zwei Männer", "Two men", True), ("Drei Kinder", "Three children", True), ("Zwei Hunde", "Two dogs", True),
    ("Mehrere Menschen", "Several people", True), ("Zwei Frauen", "Two women", True),
]
_CLOTHES = [("in einem roten Hemd", "in a red shirt"), ("mit einem blauen Hut", "with a blue hat"),
            ("in einer schwarzen Jacke", "in a black jacket"), ("mit einer Brille", "with glasses")]
_VERBS = [  # German singular, plural, English singular, plural
    ("läuft", "laufen", "is running", "are running"), ("steht", "stehen", "is standing", "are standing"),
    ("sitzt", "sitzen", "is sitting", "are sitting"), ("spielt", "spielen", "is playing", "are playing"),
    ("wartet", "warten", "is waiting", "are waiting"), ("springt", "springen", "is jumping", "are jumping"),
    ("fährt Fahrrad", "fahren Fahrrad", "is riding a bike", "are riding bikes"),
    ("singt", "singen", "is singing", "are singing"), ("schläft", "schlafen", "is sleeping", "are sleeping"),
]
_PLACES = [("auf der Straße", "on the street"), ("im Park", "in the park"), ("am Strand", "on the beach"),
           ("im Schnee", "in the snow"), ("vor einem Gebäude", "in front of a building"),
           ("auf einer Wiese", "in a meadow"), ("im Wasser", "in the water"), ("neben einem Zaun", "next to a fence"),
           ("auf einer Bühne", "on a stage"), ("in der Stadt", "in the city")]


def caption_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        s_de, s_en, plural = rng.choice(_SUBJECTS)
        if rng.random() < 0.3 and not plural:
            c_de, c_en = rng.choice(_CLOTHES)
            s_de, s_en = f"{s_de} {c_de}", f"{s_en} {c_en}"
        v = rng.choice(_VERBS)
        p_de, p_en = rng.choice(_PLACES)
        de.append(f"{s_de} {v[1] if plural else v[0]} {p_de}.")
        en.append(f"{s_en} {v[3] if plural else v[2]} {p_en}.")
    return de, en


def make_multi30k(root: Path, sizes: dict[str, int] | None = None) -> Path:
    """Multi30k's raw layout: {train,val,test_2016_flickr}.{de,en}.gz, one caption per line."""
    root.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {"train": 1200, "val": 64, "test_2016_flickr": 64}
    for i, (split, n) in enumerate(sizes.items()):
        for lang, lines in zip(("de", "en"), caption_pairs(n, seed=i)):
            with gzip.open(root / f"{split}.{lang}.gz", "wt", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
    return root


# ---- images

def _digit_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n 28x28 uint8 digits laid out like MNIST's (a 20x20 digit centred in 28x28), from scikit-learn's bundled
    8x8 scans of real handwritten digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    out = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        small = Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8))
        out[i, 4:24, 4:24] = np.asarray(small.resize((20, 20), Image.BILINEAR))
    return out, digits.target[:n].astype(np.uint8)


def write_idx(path: Path, array: np.ndarray) -> Path:
    """An IDX file (unsigned bytes) as MNIST ships it; gzipped when the name ends in .gz."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def make_mnist(root: Path, n_test: int = 300, n_train: int = 0, gz: bool = True) -> Path:
    """MNIST's IDX files: t10k-* (n_test images), and train-* when n_train > 0."""
    root.mkdir(parents=True, exist_ok=True)
    images, labels = _digit_images(n_test + n_train)
    ext = ".gz" if gz else ""
    for split, sl in (("t10k", slice(0, n_test)), ("train", slice(n_test, n_test + n_train))):
        if sl.stop > sl.start:
            write_idx(root / f"{split}-images-idx3-ubyte{ext}", images[sl])
            write_idx(root / f"{split}-labels-idx1-ubyte{ext}", labels[sl])
    return root


CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _cifar_image(label: int, rng: np.random.Generator) -> np.ndarray:
    """A 32x32 RGB picture: a class-coloured blob on a noisy background."""
    hue = np.array([(label * 37) % 256, (label * 91 + 60) % 256, (label * 151 + 120) % 256], np.float32)
    img = rng.normal(110, 30, (32, 32, 3)).clip(0, 255)
    cy, cx, r = rng.integers(10, 22), rng.integers(10, 22), rng.integers(6, 11)
    yy, xx = np.mgrid[:32, :32]
    blob = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    img[blob] = 0.3 * img[blob] + 0.7 * hue
    return img.astype(np.uint8)


def cifar_pngs(split: str, per_class: int, seed: int) -> dict[str, bytes]:
    """{"<split>/<class>/<name>.png": PNG bytes}, per_class images of each CIFAR-10 class."""
    rng = np.random.default_rng(seed)
    files = {}
    for label, cls in enumerate(CIFAR10_CLASSES):
        for i in range(per_class):
            buf = io.BytesIO()
            Image.fromarray(_cifar_image(label, rng)).save(buf, format="PNG")
            files[f"{split}/{cls}/{cls}_s_{i:06d}.png"] = buf.getvalue()
    return files


def make_cifar10(root: Path, train_per_class: int = 20, test_per_class: int = 10, as_zip: bool = True) -> Path:
    """CIFAR-10 as the offline copy holds it: zips of <split>/<class>/*.png (stored, no folder entries); or, with
    as_zip=False, the same PNGs in folders root/<split>/<class>/."""
    root.mkdir(parents=True, exist_ok=True)
    splits = {"test": ("cifar10_test.zip", test_per_class, 1),
              "train": (f"cifar10_train_subset_{train_per_class}_per_class.zip", train_per_class, 0)}
    for split, (zip_name, per_class, seed) in splits.items():
        files = cifar_pngs(split, per_class, seed)
        if as_zip:
            with zipfile.ZipFile(root / zip_name, "w", zipfile.ZIP_STORED) as zf:
                for name, data in files.items():
                    zf.writestr(name, data)
        else:
            for name, data in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(data)
    return root


def membrane_slice(seed: int, size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """An EM-like slice: cells (a Voronoi tiling) bright and textured, membranes between them dark; the mask is
    255 inside cells and 0 on membranes, as in the ISBI 2012 labels."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(seed)
    cells = rng.uniform(0, size, (max(8, size * size // 1600), 2))
    pixels = np.mgrid[:size, :size].reshape(2, -1).T
    two, _ = cKDTree(cells).query(pixels, k=2)  # distances to the nearest two cell centres
    membrane = (two[:, 1] - two[:, 0] < 3.0).reshape(size, size)
    label = np.where(membrane, 0, 255).astype(np.uint8)
    image = rng.normal(170, 25, (size, size))
    image[membrane] = rng.normal(60, 20, int(membrane.sum()))
    return image.clip(0, 255).astype(np.uint8), label


def make_membrane(root: Path, n: int = 30, size: int = 256) -> Path:
    """The ISBI 2012 layout: image/<i>.png (8-bit gray) and label/<i>.png (0 / 255), slices 0..n-1."""
    (root / "image").mkdir(parents=True, exist_ok=True)
    (root / "label").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        image, label = membrane_slice(i, size)
        Image.fromarray(image, "L").save(root / "image" / f"{i}.png")
        Image.fromarray(label, "L").save(root / "label" / f"{i}.png")
    return root


# ---- the data folder


# ---- labelled sentences: SST-2's layout (lowercased, tab-separated, header sentence<TAB>label, no quoting)

_POSITIVE = ["gripping", "funny", "charming", "moving", "brilliant", "warm", "clever", "beautiful"]
_NEGATIVE = ["dull", "tedious", "clumsy", "bland", "boring", "awful", "lifeless", "messy"]
_NOUNS = ["movie", "film", "story", "script", "performance", "comedy", "drama", "picture"]
_FILLERS = ["a", "the", "this", "an often", "a truly", "its", "one", "a rather"]


def sentiment_rows(n: int, seed: int) -> list[tuple[str, int]]:
    """(sentence, label) pairs whose label a word of the sentence decides, in SST-2's lowercased, tokenized style."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        adj = rng.choice(_POSITIVE if label else _NEGATIVE)
        words = [rng.choice(_FILLERS), adj, rng.choice(_NOUNS)]
        if rng.random() < 0.5:
            words += ["and", rng.choice(_FILLERS), rng.choice(_NOUNS)]
        rows.append((" ".join(words) + (" ." if rng.random() < 0.5 else ""), label))
    return rows


def make_sst2(root: Path, n_train: int = 400, n_dev: int = 80, n_test: int = 80) -> Path:
    """{train,dev,test}.tsv as the offline copy of GLUE SST-2 lays them out."""
    root.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", n_train, 0), ("dev", n_dev, 1), ("test", n_test, 2)):
        lines = ["sentence\tlabel"] + [f"{text} \t{label}" for text, label in sentiment_rows(n, seed)]
        (root / f"{name}.tsv").write_text("\n".join(lines) + "\n")
    return root


def make_data_dir(root: Path) -> Path:
    """Every small dataset, laid out as in ../shared/data."""
    make_tinyshakespeare(root / "tinyshakespeare")
    make_wikitext2(root / "wikitext2")
    make_multi30k(root / "multi30k")
    make_mnist(root / "mnist")
    make_cifar10(root / "cifar10")
    make_membrane(root / "isbi2012_em_membrane")
    make_sst2(root / "sst2")
    return root


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> Path:
    """A data folder like ../shared/data with a small made-up copy of each dataset (built once per session)."""
    return make_data_dir(tmp_path_factory.mktemp("data"))
