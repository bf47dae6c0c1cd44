"""Where text comes from: local .txt/.jsonl/.parquet files or a Hugging Face hub dataset, as an iterator of
documents with an identity (what the token cache is keyed by)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from attnlab.data.cache import file_identity
from attnlab.errors import UserError

log = logging.getLogger("attnlab")

OBJECTIVES = ("causal", "masked")
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet", ".tsv", ".csv")
SEPARATOR = "\n"  # ends each record (jsonl, parquet, hub) when the tokenizer has no end-of-text token


# ---- documents: where the text comes from

@dataclass
class Source:
    """The documents of one split: `docs()` iterates them; `key` identifies the content for the cache;
    `records` is True for one-document-per-record sources (jsonl, parquet, hub), which get a separator."""

    name: str
    key: Any
    docs: Callable[[], Iterator[str]]
    records: bool = False


def _check_file(path: Path, hint: str | None) -> None:
    if not path.is_file():
        raise UserError(
            f"text file {path} does not exist. "
            + (hint + " " if hint else "")
            + f"Put the file there, or point data.files / data.val_files / data.test_files at your own "
            f"{'/'.join(TEXT_SUFFIXES)} files (paths relative to where you run train.py, or absolute)."
        )
    if path.suffix not in TEXT_SUFFIXES:
        raise UserError(f"{path}: attnlab reads text from {', '.join(TEXT_SUFFIXES)} files; convert it to one "
                        "of them.")
    if path.stat().st_size == 0:
        raise UserError(f"text file {path} is empty: fill it with text (or remove it from data.files).")


def _txt_docs(path: Path, encoding: str = "utf-8") -> Iterator[str]:
    with open(path, encoding=encoding, newline="") as f:
        yield from f  # one document per line, newline kept, so the token stream is the file itself


def _missing_column(path, column: str, available: list[str]) -> UserError:
    return UserError(
        f"{path} has no text column '{column}' (its columns: {', '.join(map(str, available)) or 'none'}). "
        "Set data.text_column to the column that holds the text, e.g. "
        f"data.text_column={available[0] if available else 'text'}."
    )


def _jsonl_docs(path: Path, column: str, encoding: str = "utf-8") -> Iterator[str]:
    with open(path, encoding=encoding) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}, line {n}: not valid JSON ({e}). Each line of a .jsonl file must be one "
                                "JSON object.") from None
            if not isinstance(record, dict) or column not in record:
                raise _missing_column(path, column, list(record) if isinstance(record, dict) else [])
            if record[column]:
                yield str(record[column])


def _parquet_docs(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if column not in pf.schema_arrow.names:
        raise _missing_column(path, column, pf.schema_arrow.names)
    for batch in pf.iter_batches(columns=[column], batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text:
                yield str(text)


def file_source(name: str, files: list[str], text_column: str, hint: str | None, encoding: str = "utf-8") -> Source:
    paths = [Path(f).expanduser() for f in files]
    for p in paths:
        _check_file(p, hint)
    if any(p.suffix != ".txt" for p in paths) and any(p.suffix == ".txt" for p in paths):
        raise UserError(f"data.{name}_files mixes .txt with record files (.jsonl/.parquet): use one kind per split.")

    def docs() -> Iterator[str]:
        for p in paths:
            try:
                if p.suffix == ".txt":
                    yield from _txt_docs(p, encoding)
                elif p.suffix == ".jsonl":
                    yield from _jsonl_docs(p, text_column, encoding)
                elif p.suffix in (".tsv", ".csv"):  # a column of a table with a header (GLUE's .tsv: no quoting)
                    from attnlab.data.text.classification import read_table

                    yield from (r[text_column] for r in read_table(p, [text_column], encoding))
                else:
                    yield from _parquet_docs(p, text_column)
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{p} is not {encoding} text ({e.reason} at byte {e.start}; data.encoding={encoding}). Give the "
                    "encoding it was written in, e.g. data.encoding=latin-1 (or cp1252, utf-16), or convert it: "
                    f"`iconv -f latin1 -t utf-8 {p.name} > {p.stem}.utf8{p.suffix}`, and point data.files at the "
                    "converted file."
                ) from None

    records = paths[0].suffix != ".txt"
    identity = {"files": [file_identity(p) for p in paths], "column": text_column if records else None}
    if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        identity["encoding"] = encoding  # the tokens cached for a file depend on how it was read
    return Source(name, identity, docs, records)


def hub_source(name: str, hub: dict, split: str, text_column: str, cache_dir: Path,
               skip: int = 0, take: int | None = None) -> Source:
    """Documents of a split of a hub dataset (the first `skip` left out, at most `take`)."""
    key = {"hub": hub, "split": split, "column": text_column, "skip": skip, "take": take}

    def docs() -> Iterator[str]:
        ds = load_hub_split(hub, split, cache_dir)
        columns = ds.column_names or (list(ds.features) if ds.features else None)
        if columns is not None and text_column not in columns:
            raise _missing_column(f"hub dataset {hub['path']} ({split})", text_column, columns)
        if skip:
            ds = ds.skip(skip)
        if take is not None:
            ds = ds.take(take)
        for record in ds:
            if text_column not in record:
                raise _missing_column(f"hub dataset {hub['path']} ({split})", text_column, list(record))
            if record[text_column]:
                yield str(record[text_column])

    return Source(name, key, docs, records=True)


def load_hub_split(hub: dict, split: str, cache_dir: Path,
                   local: str = "train on local files with data=text data.files=[...]"):
    import datasets

    try:
        return datasets.load_dataset(hub["path"], hub.get("name"), split=split, streaming=bool(hub.get("streaming")),
                                     cache_dir=str(Path(cache_dir) / "hf_datasets"))
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as e:
        raise UserError(
            f"could not load the hub dataset '{hub['path']}' (split '{split}'): {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}. Hub datasets need network access the first time "
            f"(they are then cached in {Path(cache_dir) / 'hf_datasets'}); check data.hub.path / data.hub.name / "
            f"the split names, go online, or {local}."
        ) from None
