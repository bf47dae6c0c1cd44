"""Documents tokenized once into memory-mapped token arrays (and document ends) under the cache directory."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnlab.data.text.sources import SEPARATOR, Source
from attnlab.data.text.tokenizers import CharTokenizer, TextTokenizer
from attnlab.errors import UserError


log = logging.getLogger("attnlab")


# ---- token arrays on disk

class TokenArray:
    """A slice [start, end) of a token file on disk. Training reads its windows with `read` (one pread each): the
    file's pages stay in the OS page cache instead of being mapped into the process, where every page a run has
    touched counts in its resident memory (a random window's fault maps its neighbours too: +0.07 GB after 20 steps
    on 200 MB of text), so a run's memory does not grow with the corpus it visits. `array` memory-maps the whole
    slice, for reading it through."""

    def __init__(self, path: Path, dtype: str, start: int = 0, end: int | None = None):
        self.path, self.dtype = Path(path), dtype
        total = self.path.stat().st_size // np.dtype(dtype).itemsize
        self.start, self.end = start, total if end is None else end
        self._mm: np.memmap | None = None
        self._file = None  # opened lazily, so DataLoader workers each open their own

    def __len__(self) -> int:
        return self.end - self.start

    def read(self, a: int, b: int) -> np.ndarray:
        """Tokens [a, b) of this slice (0 <= a <= b <= len), copied from the file."""
        if self._file is None:
            self._file = open(self.path, "rb")  # noqa: SIM115 (closed with the object)
        size = np.dtype(self.dtype).itemsize
        data = os.pread(self._file.fileno(), (b - a) * size, (self.start + a) * size)
        return np.frombuffer(data, dtype=self.dtype)

    @property
    def array(self) -> np.ndarray:
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._mm[self.start : self.end]

    def __getstate__(self):
        return self.__dict__ | {"_mm": None, "_file": None}

    def slice(self, a: int, b: int) -> TokenArray:
        return TokenArray(self.path, self.dtype, self.start + a, self.start + b)


def tokenize_to_disk(source: Source, tok: TextTokenizer, out: Path, eot: int | None) -> tuple[Path, Path]:
    """Writes the token ids of all documents to `out`.bin (uint16 when the vocabulary fits) and the token offset
    at which each document ends to `out`.docs.npy. Atomic: a run that stops halfway leaves no cache behind.
    Processes preparing the same split at once (DDP ranks, parallel sweep jobs) take turns through a file lock:
    the first writes it, the others wait and use it."""
    from filelock import FileLock

    bin_path, docs_path = out.with_suffix(".bin"), out.with_suffix(".docs.npy")
    itemsize = np.dtype(_token_dtype(tok)).itemsize
    if not _intact(bin_path, docs_path, itemsize):
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{out}.lock"):
            if not _intact(bin_path, docs_path, itemsize):  # another process may have written them meanwhile
                if bin_path.exists() or docs_path.exists():
                    log.warning("the token cache %s is damaged (cut short or unreadable, as a full disk or a killed "
                                "copy leaves it): tokenizing the %s split again", bin_path, source.name)
                    bin_path.unlink(missing_ok=True)
                    docs_path.unlink(missing_ok=True)
                try:
                    _write_tokens(source, tok, out, eot)
                except BaseException:  # Ctrl-C, a full disk: no temporaries left behind
                    for tmp in out.parent.glob(f"{out.name}.{os.getpid()}.*.tmp"):
                        tmp.unlink(missing_ok=True)
                    raise
    return bin_path, docs_path


def _token_dtype(tok: TextTokenizer):
    return np.uint16 if tok.vocab_size <= 2**16 else np.uint32


def _intact(bin_path: Path, docs_path: Path, itemsize: int) -> bool:
    """Both files there, and the token file holds exactly the tokens the document index ends at."""
    try:
        ends = np.load(docs_path, mmap_mode="r")
        return len(ends) > 0 and bin_path.stat().st_size == int(ends[-1]) * itemsize
    except (OSError, ValueError, EOFError):
        return False


def _write_tokens(source: Source, tok: TextTokenizer, out: Path, eot: int | None) -> None:
    dtype = _token_dtype(tok)
    bin_path, docs_path = out.with_suffix(".bin"), out.with_suffix(".docs.npy")
    tmp, docs_tmp = (out.with_suffix(f".{os.getpid()}{suffix}.tmp") for suffix in (".bin", ".docs.npy"))
    ends_tmp = out.with_suffix(f".{os.getpid()}.ends.tmp")  # document ends, streamed: memory bounded by a chunk
    written = n_docs = 0
    log.info("tokenizing the %s split into %s", source.name, bin_path)
    from tqdm.auto import tqdm

    # a progress bar on a terminal (documents, tokens); HF tokenizers' encode_batch already uses every core
    bar = tqdm(desc=f"tokenizing {source.name}", unit=" docs", disable=None, leave=False)
    with open(tmp, "wb") as f, open(ends_tmp, "wb") as ends, bar:
        for chunk in _chunks(source.docs(), 8192):
            if source.records and eot is None:  # records separated by newlines when there is no end-of-text token
                chunk = [d if d.endswith(SEPARATOR) else d + SEPARATOR for d in chunk]
            if isinstance(tok, CharTokenizer):
                chunk = [tok.normalize(d) for d in chunk]  # lowercasing may change a document's length
                ids = tok.encode_array("".join(chunk))
                lengths = [len(d) for d in chunk]
            else:
                encoded = tok.encode_batch(chunk)
                if source.records and eot is not None:
                    encoded = [e + [eot] for e in encoded]
                lengths = [len(e) for e in encoded]
                ids = np.fromiter((i for e in encoded for i in e), dtype=np.int64, count=sum(lengths))
            f.write(ids.astype(dtype).tobytes())
            ends.write((written + np.cumsum(lengths, dtype=np.int64)).tobytes())
            n_docs += len(lengths)
            written += len(ids)
            bar.update(len(chunk))
            bar.set_postfix_str(f"{written:,} tokens", refresh=False)
    if written == 0:
        tmp.unlink()
        ends_tmp.unlink()
        raise UserError(f"the {source.name} split holds no text (0 tokens after tokenization): check its files "
                        "(data.files / data.val_files / data.test_files) or data.text_column.")
    with open(docs_tmp, "wb") as f, open(ends_tmp, "rb") as ends:  # a .npy: its header, then the streamed ends
        np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(np.int64).str, "fortran_order": False,
                                                 "shape": (n_docs,)})
        shutil.copyfileobj(ends, f, 1 << 20)
    ends_tmp.unlink()
    docs_tmp.replace(docs_path)
    tmp.replace(bin_path)


def _chunks(it: Iterator[str], n: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for doc in it:
        chunk.append(doc)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
