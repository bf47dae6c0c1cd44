"""Reading sentence pairs: parallel files (plain or .gz), TSV, Multi30k's raw files, hub datasets."""

from __future__ import annotations

import gzip
import unicodedata
import logging
import urllib.request
from pathlib import Path


from attnlab.errors import UserError

log = logging.getLogger("attnlab")

MULTI30K_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.{lang}.gz"


# ---- reading sentence pairs

def clean_text(text: str, lowercase: bool = False, normalize: str | None = None) -> str:
    text = unicodedata.normalize(normalize, text) if normalize else text
    return text.lower() if lowercase else text


def _read_lines(path: Path, encoding: str = "utf-8") -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding=encoding) as f:
            return [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not {encoding} text ({e.reason} at byte {e.start}; data.encoding={encoding}). "
                        "Give the encoding it was written in, e.g. data.encoding=latin-1 (or cp1252, utf-16), or "
                        f"convert it: `iconv -f latin1 -t utf-8 {path.name} > "
                        f"{path.stem}.utf8{path.suffix}`.") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise UserError(f"{path} is not a complete gzip file ({e}): download it again, or give it uncompressed "
                        "without the .gz suffix.") from None


def _check_exists(path: Path, hint: str) -> None:
    if not path.is_file():
        raise UserError(f"parallel text file {path} does not exist. {hint}")


def read_pair(src_path: Path, tgt_path: Path, hint: str, encoding: str = "utf-8") -> tuple[list[str], list[str]]:
    """The sentences of two line-aligned files; empty pairs are left out (with a warning)."""
    for p in (src_path, tgt_path):
        _check_exists(p, hint)
    src, tgt = _read_lines(src_path, encoding), _read_lines(tgt_path, encoding)
    if len(src) != len(tgt):
        raise UserError(
            f"{src_path} has {len(src):,} lines but {tgt_path} has {len(tgt):,}: line i of one must be the "
            "translation of line i of the other. Check that both files are complete and of the same split."
        )
    return drop_empty(src, tgt, f"{src_path} / {tgt_path}")


def read_tsv(path: Path, hint: str, encoding: str = "utf-8") -> tuple[list[str], list[str]]:
    _check_exists(path, hint)
    src, tgt = [], []
    for n, line in enumerate(_read_lines(path, encoding), 1):
        cols = line.split("\t")
        if len(cols) < 2 and line.strip():
            raise UserError(f"{path}, line {n}: a TSV line needs the source and the target separated by a tab "
                            f"(found {len(cols)} column). Fix the line or remove it.")
        src.append(cols[0] if cols else "")
        tgt.append(cols[1] if len(cols) > 1 else "")
    return drop_empty(src, tgt, str(path))


def drop_empty(src: list[str], tgt: list[str], where: str) -> tuple[list[str], list[str]]:
    keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s.strip() and t.strip()]
    if len(keep) < len(src):
        kept = set(keep)
        empty = [i + 1 for i in range(len(src)) if i not in kept]
        log.warning("%s: %d pair(s) with an empty side left out (lines %s%s)", where, len(empty),
                    ", ".join(map(str, empty[:10])), ", ..." if len(empty) > 10 else "")
    if not keep:
        raise UserError(f"{where}: every line pair has an empty side; there is nothing to translate.")
    return [src[i].strip() for i in keep], [tgt[i].strip() for i in keep]


def multi30k_files(data_dir: Path, split: str, lang: str, download: bool) -> Path:
    name = MULTI30K_SPLITS[split]
    path = data_dir / "multi30k" / f"{name}.{lang}.gz"
    if path.is_file() or not download:
        return path
    url = MULTI30K_URL.format(name=name, lang=lang)
    log.info("multi30k: downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            payload = r.read()
    except OSError as e:
        log.warning("multi30k: could not download %s (%s)", url, e)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(payload)
    tmp.replace(path)
    return path


def hub_pairs(hub: dict, split: str, src_lang: str, tgt_lang: str, cache_dir: Path) -> tuple[list[str], list[str]]:
    """Pairs of a hub dataset whose records hold {"translation": {lang: text, ...}} (WMT, IWSLT)."""
    from attnlab.data.text.sources import load_hub_split

    ds = load_hub_split(hub, split, cache_dir, local="translate local files with data=parallel "
                        "data.train=[train.src,train.tgt] data.val=[val.src,val.tgt]")
    src, tgt = [], []
    for record in ds:
        pair = record.get("translation") or record
        if src_lang not in pair or tgt_lang not in pair:
            raise UserError(
                f"hub dataset {hub['path']} ({hub.get('name')}) has no '{src_lang}'/'{tgt_lang}' pair: its "
                f"records hold {sorted(pair)}. Set data.src_lang / data.tgt_lang to two of them, or pick the "
                "dataset config of your language pair (data.hub.name)."
            )
        src.append(pair[src_lang])
        tgt.append(pair[tgt_lang])
    return drop_empty(src, tgt, f"hub dataset {hub['path']} ({split})")
