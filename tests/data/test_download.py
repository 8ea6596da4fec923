import shutil

import pytest

from secure_fed.cli import main
from secure_fed.data import load_registered
from secure_fed.data.download import SHA256, download, sha256_of
from secure_fed.errors import DataError


def test_shipped_digests_match_the_shared_copy(data_root):
    sums = dict(line.split()[::-1] for line in (data_root / "SHA256SUMS").read_text().splitlines() if line.strip())
    for rel, digest in SHA256.items():
        assert sums[rel] == digest


def test_download_from_file_mirror_verifies_and_loads(tmp_path, data_root):
    mirror = f"file://{data_root / 'mulan'}"
    assert main(["data", "download", "emotions", "--root", str(tmp_path / "root"), "--mirror", mirror]) == 0
    ds = load_registered("emotions", tmp_path / "root")
    assert ds.train.num_instances == 391
    for rel in ("mulan/emotions/emotions-train.arff", "mulan/emotions/emotions.xml"):
        assert sha256_of(tmp_path / "root" / rel) == SHA256[rel]


def test_corrupted_mirror_is_rejected_and_nothing_kept(tmp_path, data_root):
    mirror = tmp_path / "mirror"
    shutil.copytree(data_root / "mulan" / "emotions", mirror / "emotions")
    (mirror / "emotions" / "emotions-test.arff").chmod(0o644)
    with (mirror / "emotions" / "emotions-test.arff").open("a") as fh:
        fh.write("% tampered\n")
    with pytest.raises(DataError, match="SHA-256 mismatch"):
        download("emotions", tmp_path / "root", mirror=f"file://{mirror}")
    assert not (tmp_path / "root" / "mulan" / "emotions" / "emotions-test.arff").exists()
    assert not list((tmp_path / "root" / "mulan" / "emotions").glob("*.part"))


def test_unreachable_mirror_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="could not fetch"):
        download("yeast", tmp_path, mirror=f"file://{tmp_path}/nowhere")
