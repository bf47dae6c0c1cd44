"""`make data` / `python -m attnlab.data.fetch [NAME ...] [--data-dir DIR] [--force]`: download each dataset from its
public source, check the sha256 of every downloaded file, and lay it out under the data dir ($ATTNLAB_DATA_DIR, default
./data) where attnlab's data configs read it.

A dataset is fetched into a hidden staging folder and moved into place only once every file of it is verified, so a
failed or interrupted fetch leaves nothing half-written. Its folder then gets a SHA256SUMS file (`sha256sum -c` format)
listing what was laid out: a folder whose SHA256SUMS verifies is complete and is not fetched again (--force does).
The offline copies in ../shared/data carry their own SHA256SUMS, so they are verified and reported, never written.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.client
import os
import shutil
import ssl
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from attnlab.errors import UserError

SUMS = "SHA256SUMS"
TIMEOUT = 60  # seconds without data before a download counts as failed
CHUNK = 1 << 20


@dataclass(frozen=True)
class File:
    """One download and how it is laid out in the dataset's folder: saved as `dest` (gunzipped first with
    unpack="gunzip"), or, with unpack="tar" / "zip", the archive's `members` (member -> destination) extracted."""

    url: str
    sha256: str
    dest: str = ""
    unpack: str | None = None
    members: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return Path(urlsplit(self.url).path).name

    @property
    def outputs(self) -> list[str]:
        return list(self.members.values()) if self.unpack in ("tar", "zip") else [self.dest]

    @property
    def by_hand(self) -> str:
        """Where a copy downloaded by hand is picked up (relative to the dataset's folder)."""
        return self.dest if self.unpack is None else self.name


def _sums(text: str) -> dict[str, str]:
    """{path: sha256} from `sha256sum` output lines ("<sha256>  <path>", or " *<path>" in binary mode)."""
    pairs = (line.strip().split(None, 1) for line in text.splitlines() if line.strip())
    return {path.lstrip("*"): digest.lower() for digest, path in pairs}


def _files(base_url: str, sums: str) -> list[File]:
    """Files saved as is, each under its path relative to base_url."""
    return [File(f"{base_url}/{path}", digest, path) for path, digest in _sums(sums).items()]


def _github(repo: str, commit: str, folder: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{folder}"


CIFAR10_MEMBERS = ["batches.meta", *(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "readme.html"]

# The sha256 of a file that ../shared/data also holds byte for byte (the same blob at the same commit) is that copy's
# sha256; the others are the values other projects publish, named at each entry. GitHub files are pinned to a commit.
MANIFEST: dict[str, list[File]] = {
    # karpathy/char-rnn: 1,115,394 characters; read by data=tinyshakespeare
    "tinyshakespeare": _files(_github("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
                                      "data/tinyshakespeare"), """
        86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed  input.txt
    """),
    # WikiText-2 v1 tokenized, as pytorch/examples ships it (train.txt unchanged since d5678bc). train.txt's sha256 is
    # the one several projects pin for this URL; their valid/test values equal those of the offline copy.
    "wikitext2": _files(_github("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                                "word_language_model/data/wikitext-2"), """
        9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f  train.txt
        f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8  valid.txt
        d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0  test.txt
    """),
    # Multi30k task 1, raw en/de (gzipped, read as is by data=multi30k)
    "multi30k": _files(_github("multi30k/dataset", "a3d2e0d26b56f3846f66a952536ffed4e401d05a", "data/task1/raw"), """
        726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6  train.de.gz
        d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f  train.en.gz
        f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a  val.de.gz
        14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28  val.en.gz
        9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8  test_2016_flickr.de.gz
        611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9  test_2016_flickr.en.gz
    """),
    # LeCun's four IDX files as PyTorch's mirror serves them; sha256 as tensorflow-datasets publishes them
    # (url_checksums/mnist.txt). The offline copy's t10k files were re-gzipped, so they differ from these.
    "mnist": _files("https://ossci-datasets.s3.amazonaws.com/mnist", """
        440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609  train-images-idx3-ubyte.gz
        3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c  train-labels-idx1-ubyte.gz
        8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6  t10k-images-idx3-ubyte.gz
        f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6  t10k-labels-idx1-ubyte.gz
    """),
    # the official python tarball (170,498,071 bytes; sha256 as Keras' cifar10.load_data pins it), unpacked to
    # cifar10/cifar-10-batches-py/ as torchvision lays it out
    "cifar10": [File("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                     "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce", unpack="tar",
                     members={f"cifar-10-batches-py/{m}": f"cifar-10-batches-py/{m}" for m in CIFAR10_MEMBERS})],
    # ISBI 2012 training stack as zhixuhao/unet ships it: 30 slices image/<i>.png + label/<i>.png
    "isbi2012_em_membrane": _files(_github("zhixuhao/unet", "b45af4d458437d8281cc218a07fd4380818ece4a",
                                           "data/membrane/train"), """
        12c0ed6f42fc09f512abf6b354f217c950e4c8223b57a0315449b62a14556523  image/0.png
        2cfc7ee635a6f85d5faf5c82a71d3a37bf5af4784b554964e3e07193e3ee2166  image/1.png
        fe60d8d4f93102666a23a18d718b4b59fab8e616987d11c5072f4a87fac7301f  image/2.png
        636d16cbb02f99dda4c9fb6db98dfba066142afa981ffdcfaf54453982e8250c  image/3.png
        991fb3a8e4abc73da1d6159ca28fa4397f0a8351f30a8ba3669c86414d2ce239  image/4.png
        7e9d9fb787664336d6f2cd68b23986f04527e7f8f494410983b4d70c6de1de3b  image/5.png
        7c0a87933ffc72f4ff02f5996d9c3f69fe9a0b5277507415743ad8afb5e5d308  image/6.png
        19f2c25716107d41008c83ba8a814ae47a090e00dea766dde38dce1f00899270  image/7.png
        a8979e4abd1a10af9ca75e614d97875659adbd8ee3a68eba483bf556cfe3023d  image/8.png
        730ebf435ab0f6e625d342552ad03736799fd660d0c6af744674c61a46aa082a  image/9.png
        7c3717bcd48c4b7e5c878d7f0b809b8687a4e6fac471f3863de320a82ee72b8a  image/10.png
        dd7857b25ca1417f87c282750e22c50947f75e81fa032d4e0c96b902c9dc9757  image/11.png
        9f8eff9239bb764d51524a998387a7babcff9f62161804651b030b81aabd5ab8  image/12.png
        377e5cdbcd7f0ac7336f482fc7ead7446887863f26769b3841fe98aadca77dad  image/13.png
        f50d2d77acd2df564c5f0f40b1b24cd929f5944460aa4cd90c422cb5cef33a59  image/14.png
        3e13fdea09accc14f46fb2f3ffa1e882cdd9c53b28a6842c4c10229692c7d1a4  image/15.png
        ffc951c12450f94129582c16fd0d4b165c4a31469b0c42d966f07c183d3132e2  image/16.png
        0f4f7e8e0619e4c7d517ac68d3789a3b6248253747717eac418bb7d32bef4de3  image/17.png
        1bb1edd50595861743d14e1955dfa5d3c9395fb87563eca6dc81433bf9df49de  image/18.png
        999b55633f8d7082add72082656e9532c5c3d97203b376eb317f09ba88a5a5b7  image/19.png
        9153d14bfd15955fab576ea23281c4f23104b45dceed6e03e0b254607f50a1b2  image/20.png
        9ad07cf4f67984f17a08aa63e6d92d395ce55f5132e6ff4fa6d95d6890ea7f97  image/21.png
        6278609b4c42a7cb43212de0e2e2ceded758bafe0856fb56214ce658a61668e4  image/22.png
        9ef4e9fbc838b9791af83a36918d729a0ea2e90ebc71c4a3c4554059f9379756  image/23.png
        f0f917b9c3e9c96d16ea287aff9b05ecf4de88bc61d478e4aefcb64932fba70c  image/24.png
        e0154737e76392e8bf94fb2c0dfa5ddad4b53aeec942a0a8cdd8ba63443e6072  image/25.png
        d0ff11e09b0ee0c817334946e746a38ab621161d5f9c46af95c68b851f8d9a1a  image/26.png
        eed8e8bee1db8fe7af39b5b43ecf14282c5c33eca0959726eea06f662027eacc  image/27.png
        974df4b51e8905bdaabe61e80496cbf331f5c9aa9ddc2cb94113f58c2b7d2837  image/28.png
        d9ae868509c610a69acbf3d69cde4f36a8e344cbbc444f93c917bf7b9f3e784f  image/29.png
        13b67edd7607a1f284c09170c96a27d38422b0ffaf88024ea5b689acb5e1b4b0  label/0.png
        cff60a00de2901e67165c91d7708d784e4c5bcc9d1c8c677922c905d63bbc3d1  label/1.png
        a578af998c017f56763b81941c4dc612dde5731809b2cea0e8ebc37aecb84dbb  label/2.png
        c8ae3b843fed02e09411a24c10850160922c331041b17c2674025f05a99b8834  label/3.png
        a2f19c01b5d982a97923a0d29e64127a05e3f496731480ac9d9d302b5427f7ff  label/4.png
        2dd5779118f6f4d87f88ec112f1cea20663b50acb8c748b0db1f23eda82b5118  label/5.png
        2b0984e9f31fb41d4c5f4a754a3e080036b7321a0cbd9591a62010d20a574ce7  label/6.png
        2ebc8c835999589bfd7d80d81f83d24e5c41138362b0faafef0f009e1ce82144  label/7.png
        db979010ca4fbdb38c8b32d455aed0da90d598153f2a0046b63d02a6efa32b9e  label/8.png
        8ee6c79adbb740595c4d61776e065e7164c00d52c7dd7562b5279041e7f3567b  label/9.png
        b0156cc8186b0ee521927ac95645b406a42d27564607a6fea3a59c34add78f7c  label/10.png
        e47b3aa0cfb3106476af1666e631d45bd16dbf2aff88260ee65d16e4134332db  label/11.png
        85a7a899c0b72b81633ad122887ba5161d650385d7775a5b3074eb00131b3620  label/12.png
        88549c22fd647312d6b37e17d33e90800d347d60ccb1156a8dde5e67394f9f3d  label/13.png
        bcd775017eb4fdbdfe7ad6cc6420b2f16aa9d0576894d08370edcf564b46680a  label/14.png
        59a854887b504ff00a5b4b93b2299bbc0bf0cbe54dea58d2b31969229b28b369  label/15.png
        b34eb88cdc3313a6f4190f5753465df7f69d8f3c243a5c25427b1b99ecfe2499  label/16.png
        4fa076cbeb744803d987dc46cf308dc3026408e7a5188838e30e25fe3ea67dbe  label/17.png
        bd009dda57f204804732f592ed1d41ba18961d83c492413fe71548efa4a288d9  label/18.png
        bf38407c55b6033c1677230228ecb100a11294aa74a7b92e5edfdc4abadcfef9  label/19.png
        7af7296f2e892866669d4e4f9c0d4178987e6ec6e7d0751ec238d1bbe2da9c55  label/20.png
        772c722acb2eac01769b53fa5037a3d62745e53102398bf9b2202df605cadda4  label/21.png
        b19f5533ec24077a2395a085fe53af75dd350ef03798c4ff40ba9ebecb2ee0ad  label/22.png
        2d8f1df5c9ee83e59eb2d709eb153b0570f12e726690f586154b01b0a88bb540  label/23.png
        6ab02d922b5c937ecfe2a479be87a5d3e5ef950dc48da09d31f37b47d899ca9c  label/24.png
        c5ea59aca7789dd507ac31c4a82bbd4c172f9e3544f8e040442c20d1dfa9e16d  label/25.png
        b056fae9f358111b6c9e2494bdba645f206be581959b8d3763e97d62a65dd961  label/26.png
        5be3823a57c82b632cead6eb09f438c6010a244dc0975f2a3e466f45d2c06840  label/27.png
        c0b0e2a2b7aad46919d1afc980f7d5e39101fb07948ce65d9cac802d8b47682e  label/28.png
        1e8839a97178914171defd6a97158f06fcac1fc3f0d45f2acdff9c49ab3fced9  label/29.png
    """),
    # GLUE SST-2 as forest-snow/alps re-splits it: train 60,614 / dev 6,735 (held out of GLUE train) / test 872
    # (GLUE's labelled dev set); TSV with header `sentence\tlabel`
    "sst2": _files(_github("forest-snow/alps", "3c7ef2c98249fc975a897b27f275695f97d5b7a9", "data/SST-2"), """
        920e317b2c52e12cd22db1da2c6708312bd7dc4f3712b9bbf1b50ee6c2c792ba  train.tsv
        92353770071a2a889f75d000a38a9e541ea8f0a5499e50f040b17917a5cbf66f  dev.tsv
        54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0  test.tsv
    """),
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_folder(folder: Path) -> tuple[dict[str, str], list[str]] | None:
    """The entries of folder/SHA256SUMS and those that fail (missing or changed); None without that file."""
    sums_file = folder / SUMS
    if not sums_file.is_file():
        return None
    sums = _sums(sums_file.read_text())
    bad = [p for p, digest in sums.items() if not (folder / p).is_file() or sha256_of(folder / p) != digest]
    return sums, bad


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _download(f: File, dataset: str, to: Path, by_hand: Path, say: Callable[[str], None]) -> None:
    """Download f.url to `to`, checking its sha256; a clear UserError on a network failure or a mismatch."""
    to.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    request = urllib.request.Request(f.url, headers={"User-Agent": "attnlab-fetch"})
    say(f"{dataset}: downloading {f.url}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as r, open(to, "wb") as out:
            total, shown = int(r.headers.get("Content-Length") or 0), 0
            while chunk := r.read(CHUNK):
                out.write(chunk)
                h.update(chunk)
                n += len(chunk)
                if total > 50 * CHUNK and sys.stderr.isatty() and n * 20 // total > shown:
                    shown = n * 20 // total
                    print(f"\r  {_size(n)} of {_size(total)}", end="", file=sys.stderr, flush=True)
        if shown:
            print(file=sys.stderr)
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError) as e:
        reason = f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)
        raise UserError(
            f"could not download {dataset} from {f.url} ({reason}); nothing of {dataset} was written. Check the "
            "network connection and any proxy (urllib reads HTTPS_PROXY / https_proxy), then run `make data` "
            f"again; or download that file by hand and put it at {by_hand}, where the next run checks its sha256 "
            f"({f.sha256}) and lays it out."
        ) from None
    if h.hexdigest() != f.sha256:
        raise UserError(
            f"{dataset}: the file downloaded from {f.url} ({n:,} bytes) has sha256 {h.hexdigest()}, but "
            f"{f.sha256} was expected, so it was discarded and nothing of {dataset} was written. The download was "
            "cut short or altered (a proxy or captive portal can do that), or the file changed at its source. Run "
            f"`make data` again; if it persists, get the file by hand, check it with `sha256sum`, and put it at "
            f"{by_hand}."
        )


def _lay_out(f: File, src: Path, out: Path) -> None:
    """Write f's outputs under `out` from the verified download `src`."""
    def write(dest: str, reader) -> None:
        (out / dest).parent.mkdir(parents=True, exist_ok=True)
        with reader as r, open(out / dest, "wb") as w:
            shutil.copyfileobj(r, w, CHUNK)

    if f.unpack is None:
        write(f.dest, open(src, "rb"))
    elif f.unpack == "gunzip":
        write(f.dest, gzip.open(src, "rb"))
    elif f.unpack in ("tar", "zip"):
        found = set()
        if f.unpack == "tar":
            with tarfile.open(src) as tar:
                for info in tar:  # one pass: a .tar.gz read out of order is decompressed again for each member
                    if info.name in f.members and info.isfile():
                        write(f.members[info.name], tar.extractfile(info))
                        found.add(info.name)
        else:
            with zipfile.ZipFile(src) as zf:
                for member in set(f.members) & set(zf.namelist()):
                    write(f.members[member], zf.open(member))
                    found.add(member)
        if set(f.members) - found:
            raise UserError(f"{f.url} has no file {', '.join(sorted(set(f.members) - found))}: the manifest in "
                            f"{__name__} does not match this archive.")
    else:
        raise ValueError(f"unknown unpack={f.unpack!r} for {f.url}")


def _read_only(path: Path) -> Path | None:
    """The folder that makes `path` unwritable (no write bit: even root must not write there), or None."""
    while not path.exists():
        path = path.parent
    return None if os.access(path, os.W_OK) and path.stat().st_mode & 0o222 else path


def fetch_dataset(name: str, files: list[File], data_dir: Path, force: bool = False,
                  say: Callable[[str], None] = print) -> None:
    folder = data_dir / name
    checked = None if force else verify_folder(folder)
    if checked is not None and checked[0] and not checked[1]:
        sums = checked[0]
        lacks = [o for f in files for o in f.outputs if o not in sums]
        counted = f"{len(sums)} file{'s match' if len(sums) > 1 else ' matches'} its {SUMS}"
        if not lacks:
            say(f"{name}: complete in {folder} ({counted})")
        else:
            say(f"{name}: verified in {folder} ({counted}), a partial copy without {', '.join(lacks[:2])}"
                f"{', ...' if len(lacks) > 2 else ''}; --force fetches the full dataset (into a writable --data-dir)")
        return
    if checked is not None and checked[1]:
        say(f"{name}: {', '.join(checked[1][:3])} in {folder} missing or changed since its {SUMS}: fetching again")
    blocked = _read_only(folder)
    if blocked is not None:
        why = "--force fetches it again" if force else "it is not complete there"
        raise UserError(f"{name}: {why}, but {blocked} is read-only and is left as it is. Fetch into a writable "
                        "folder: `make data` (./data), or --data-dir DIR / ATTNLAB_DATA_DIR=DIR.")
    data_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".fetch-{name}-", dir=data_dir))
    there = 0  # files already in place (put there by hand, or left by an earlier fetch) with the right sha256
    try:
        for f in files:
            by_hand = folder / f.by_hand
            if by_hand.is_file() and sha256_of(by_hand) == f.sha256:
                src, there = by_hand, there + 1
            else:
                src = stage / "download" / f.name
                _download(f, name, src, by_hand, say)
            _lay_out(f, src, stage / "out")
            if src.parent == stage / "download":
                src.unlink()  # a downloaded archive is not kept once unpacked
        outputs = sorted(p for p in (stage / "out").rglob("*") if p.is_file())
        digests = {p.relative_to(stage / "out").as_posix(): sha256_of(p) for p in outputs}
        for p in outputs:
            dest = folder / p.relative_to(stage / "out")
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, dest)
        (stage / SUMS).write_text("".join(f"{d}  {p}\n" for p, d in sorted(digests.items())))
        os.replace(stage / SUMS, folder / SUMS)  # written last: it marks the dataset complete
    except OSError as e:
        raise UserError(f"{name}: could not write in {data_dir} ({e}); {name} is not marked complete there, so the "
                        "next run fetches it again. Free some disk space, or fetch into another folder with "
                        "--data-dir DIR.") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    n = len(digests)
    say(f"{name}: fetched into {folder} ({n} file{'s' if n > 1 else ''}, sha256 checked"
        f"{f'; {there} already in place, not downloaded' if there else ''})")


def default_data_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_DATA_DIR") or "data")


def fetch(names: list[str] | None = None, data_dir: str | Path | None = None, force: bool = False,
          manifest: dict[str, list[File]] | None = None, say: Callable[[str], None] = print) -> None:
    """Fetch the named datasets (all by default) into data_dir; `manifest` replaces MANIFEST (tests point it at a
    local server)."""
    manifest = MANIFEST if manifest is None else manifest
    unknown = [n for n in names or [] if n not in manifest]
    if unknown:
        raise UserError(f"unknown dataset {', '.join(unknown)}: `make data` knows {', '.join(manifest)}.")
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    for name in names or list(manifest):
        fetch_dataset(name, manifest[name], data_dir, force, say)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m attnlab.data.fetch",
        description="Download the datasets attnlab's configs read, check their sha256, and lay them out.")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"datasets (default: all of {', '.join(MANIFEST)})")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="where to put them (default: $ATTNLAB_DATA_DIR, else ./data)")
    parser.add_argument("--force", action="store_true",
                        help="lay out again even what is complete (a file in place whose sha256 matches is kept)")
    args = parser.parse_args(argv)
    from attnlab.errors import fail_before_hydra

    fail_before_hydra(fetch, args.names, args.data_dir, args.force)


if __name__ == "__main__":
    main()
