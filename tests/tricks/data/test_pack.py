"""pack: the trick's effect (one contiguous pack holding every sample), exactness (same bytes), misuse, no-effect."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.data.photoset import wallpaper_sources


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    if not wallpaper_sources():
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    from pytorchtricks.data.photoset import build_photo_set

    root = tmp_path_factory.mktemp("photos")
    build_photo_set(root, 24, seed=1, workers=1, max_sources=3)
    return root


def test_pack_effect_and_exact_bytes(photos, tmp_path):
    s = ptt.pack(photos, tmp_path / "p", workers=0)
    assert s["count"] == 24 and s["rejects"] == [] and len(s["shards"]) == 1
    assert s["bytes_out"] > s["payload_bytes"] == s["bytes_in"]
    ds = ptt.ShardDataset(tmp_path / "p", decode=None)
    want = collections.Counter(p.read_bytes() for p in photos.rglob("*.jpg"))
    assert collections.Counter(ds[i][0] for i in range(len(ds))) == want


def test_resize_and_quality_applied_once(photos, tmp_path):
    ptt.pack(photos, tmp_path / "p", resize=64, quality=80, workers=0)
    ds = ptt.ShardDataset(tmp_path / "p")
    for i in range(len(ds)):
        assert min(ds[i][0].shape[:2]) == 64


def test_pack_misuse(photos, tmp_path):
    with pytest.raises(PttError, match="unknown format"):
        ptt.pack(photos, tmp_path / "p", format="parquet")


def test_pack_twice_warns_no_effect(photos, tmp_path):
    ptt.pack(photos, tmp_path / "p", workers=0)
    with pytest.warns(NoEffectWarning):
        ptt.pack(photos, tmp_path / "p", workers=0)


def test_cli_pack_and_inspect(photos, tmp_path):
    run = [sys.executable, "-m", "pytorchtricks.cli"]
    out = subprocess.run([*run, "pack", str(photos), str(tmp_path / "t"), "--format", "tar", "--workers", "2"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "packed 24 of 24 files" in out.stdout
    out = subprocess.run([*run, "inspect", str(tmp_path / "t"), "--decode"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0 and "integrity: ok" in out.stdout
    bad = subprocess.run([*run, "pack", str(photos), str(tmp_path / "x"), "--format", "zip"], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2
    bad = subprocess.run([*run, "pack", str(tmp_path / "none"), str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_bench_case_smoke_reads_the_same_data():
    from pytorchtricks.tricks.data.pack import bench_case

    case = bench_case("smoke")
    try:
        a, b = case.baseline(), case.treated()
        case.check(a, b)
        assert a == b > 0
    finally:
        case.cleanup()


def test_a_pack_config_packs_the_same_bytes_as_its_keywords(tmp_path):
    import hashlib

    from PIL import Image

    import pytorchtricks as ptt
    from pytorchtricks.core import PttError

    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    for i in range(6):
        Image.new("RGB", (40 + i, 30), (10 * i, 20, 30)).save(src / f"{i}.jpg")

    def digest(folder):
        return sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file())

    ptt.pack(str(tmp_path / "src"), str(tmp_path / "a"), format="tar", workers=0, seed=3)
    ptt.pack(str(tmp_path / "src"), str(tmp_path / "b"), ptt.PackConfig(format="tar", workers=0, seed=3))
    assert digest(tmp_path / "a") == digest(tmp_path / "b") and (tmp_path / "b" / "manifest.json").exists()
    with pytest.raises(PttError, match="not both"):
        ptt.pack(str(tmp_path / "src"), str(tmp_path / "c"), ptt.PackConfig(), workers=0)
