"""``secure-fed data download``: fetch Mulan datasets from their public source.

Files come from the Mulan repository's raw data folder (GitHub
``tsoumakas/mulan``, ``data/multi-label/NAME/``) and are verified against the
SHA-256 digests below before they are moved into place; a mismatch deletes
the download and raises. ``mirror`` replaces the base URL (``file://`` works),
which is how the tests exercise this offline.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from secure_fed.data.registry import REGISTRY, resolve_root
from secure_fed.errors import DataError
from secure_fed.io import check_writable_dir

MULAN_BASE_URL = "https://raw.githubusercontent.com/tsoumakas/mulan/master/data/multi-label"

#: SHA-256 of each file, relative to the data root (same as ``SHA256SUMS`` of the shared copy).
SHA256 = {
    "mulan/bibtex/bibtex-test.arff": "9b03329cde64d3f994bdf7fbbac3f3b10fe185c311cb9ae725475f59c7f3f922",
    "mulan/bibtex/bibtex-train.arff": "8dcc9de6e0b2cebaec8c1f4fac78431adeeb73cfd3ab879b530a66d366e59174",
    "mulan/bibtex/bibtex.xml": "08fe20013c1e75dcf1888c185f5187c95e76495b8518ce289b4d3afce38d1232",
    "mulan/emotions/emotions-test.arff": "f13d4b746b7b5c8eb484bd751d6ac463d4560dff998a93516a5c1fe35daf6c8f",
    "mulan/emotions/emotions-train.arff": "bbe704106c79bb8fb99c1d1d2e9bde081d6a2daeb01f100862f11fd91a3c1f98",
    "mulan/emotions/emotions.xml": "dbce8e6ccbbb2fcbfd9e9edbb230d7ed12692c6e13f59fdbc0161fa9b6cf2dc0",
    "mulan/scene/scene-test.arff": "ea38d20296b3ff7e220f477a3b802a9bcb2d768881fe6ee163efbc97ea527a42",
    "mulan/scene/scene-train.arff": "b53ba93bdf412de922e3960389bcee24744fa3e872ce610511fc1d750888b64d",
    "mulan/scene/scene.xml": "55d8b247b949ad5c52e5a73d8c6775ec6e5469ce9682465b45b333b68ee4bcc5",
    "mulan/yeast/yeast-test.arff": "4aaac102bff9669a765bf0b378602e5cc8c3b181048282e2f003117b496d552a",
    "mulan/yeast/yeast-train.arff": "e759dc991ff54694a4ff9c4314f3be0d6fd2b1994a4b563f57e416394c6aebbd",
    "mulan/yeast/yeast.xml": "c3056cc26444b5158b1588d1b73bec9c45429e10f0957ad085903423cb81f247",
}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(name: str, root: str | Path | None = None, *, mirror: str | None = None, force: bool = False) -> list[Path]:
    """Download dataset ``name`` into ``root`` and verify every file's SHA-256.

    Returns the paths written. Files already present with the right digest are kept.
    """
    if name not in REGISTRY:
        raise DataError(f"unknown dataset '{name}'; downloadable: {', '.join(sorted(REGISTRY))}")
    base_url = (mirror or MULAN_BASE_URL).rstrip("/")
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https", "file"):
        raise DataError(f"--mirror {mirror!r}: not a URL (http://, https:// or file://)")
    dest_root = resolve_root(root)
    verified = [dest_root / rel for rel in REGISTRY[name].files if not force and (dest_root / rel).is_file()
                and sha256_of(dest_root / rel) == SHA256[rel]]  # fmt: skip
    if len(verified) == len(REGISTRY[name].files):  # all there: nothing to write (a read-only root is fine)
        return verified
    check_writable_dir(dest_root, what="data root")
    created = [p for p in (dest_root / rel for rel in REGISTRY[name].files) for p in [p.parent, *p.parent.parents]
               if not p.exists()]  # fmt: skip
    try:
        return _fetch_all(name, base_url, dest_root, set(verified))
    except DataError:
        for d in sorted(set(created), key=lambda p: len(p.parts), reverse=True):  # the folders made for the failed fetch
            with contextlib.suppress(OSError):
                d.rmdir()  # only if empty
        raise


def _fetch_all(name: str, base_url: str, dest_root: Path, verified: set[Path]) -> list[Path]:
    """Fetch every file of ``name`` not in ``verified`` (present with the right digest, and not forced again)."""
    written = []
    for rel in REGISTRY[name].files:
        dest = dest_root / rel
        want = SHA256[rel]
        if dest in verified:
            written.append(dest)
            continue
        url = f"{base_url}/{rel.removeprefix('mulan/')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".part") as tmp:
            tmp_path = Path(tmp.name)
            try:
                with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 (user-chosen URL)
                    shutil.copyfileobj(resp, tmp)
            except (OSError, ValueError) as exc:  # ValueError: a URL urllib cannot open
                tmp_path.unlink(missing_ok=True)
                raise DataError(f"could not fetch {url}: {exc}") from None
        got = sha256_of(tmp_path)
        if got != want:
            tmp_path.unlink(missing_ok=True)
            raise DataError(f"SHA-256 mismatch for {url}: expected {want}, got {got}; file discarded")
        tmp_path.replace(dest)
        written.append(dest)
    return written
