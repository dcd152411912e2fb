"""Per-sample costs bounded (issue 34): what grows with N is counted, never timed.

The listing stats no file, the arena's key check stats its folders and a fixed sample of files, and the loader's
main process holds no Python object per sample.
"""

from __future__ import annotations

import os
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

from pytorchtricks.data.folder import JpegFolder
from pytorchtricks.tricks.data.cache_in_ram import SAMPLED_FILES, _content, cache_in_ram
from pytorchtricks.tricks.data.make_loader import _photo_bytes, make_loader

pytestmark = pytest.mark.filterwarnings("ignore::pytorchtricks.core.PttWarning")


def _tree(root: Path, n: int, classes: int = 3) -> Path:
    raws = [raw for raw, _ in _photo_bytes(4, (20, 24))]
    for i in range(n):
        f = root / f"c{i % classes}" / f"{i:05d}.jpg"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(raws[i % len(raws)])
    return root


class _StatCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real_stat, real_lstat = os.stat, os.lstat

        def stat(*a, **k):
            self.calls += 1
            return real_stat(*a, **k)

        def lstat(*a, **k):
            self.calls += 1
            return real_lstat(*a, **k)

        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(os, "lstat", lstat)


def test_listing_stats_no_file_and_keeps_image_folders_order(tmp_path, monkeypatch):
    from torchvision.datasets import ImageFolder

    root = _tree(tmp_path / "photos", 300)
    # '/' sorts after '-' (folder order matters); a non-ASCII name; a non-image (filtered out by both)
    extras = ("c0/sub/z.jpg", "c0/sub-x/y.jpg", "c1/a/b/c.jpg", "c2/\u00fc-photo.jpg", "c2/readme.txt")
    for extra in extras:
        (root / extra).parent.mkdir(parents=True, exist_ok=True)
        (root / extra).write_bytes(b"\xff\xd8")
    want = [os.path.relpath(p, root) for p, _ in ImageFolder(str(root), loader=lambda p: p).samples]
    counter = _StatCounter(monkeypatch)
    ds = JpegFolder(str(root))
    assert counter.calls < 10, f"{counter.calls} stats to list {len(ds)} files"  # folders only, not files
    assert [p.decode() for p in ds.rel_paths] == want and len(want) == 304
    assert ds.path(len(ds) - 1) == str(root / want[-1]) and ds.labels[-1] == 2


def test_the_arena_key_check_stats_folders_and_a_sample_not_every_file(tmp_path, monkeypatch):
    root = _tree(tmp_path / "photos", 600)
    ds = JpegFolder(str(root))
    first = cache_in_ram(ds, 16, cache_dir=str(tmp_path / "cache"), num_workers=0)
    counter = _StatCounter(monkeypatch)
    again = cache_in_ram(ds, 16, cache_dir=str(tmp_path / "cache"), num_workers=0)
    assert again.path == first.path
    # 3 folders + the sample + the arena's own checks (folder, files, owner, size): bounded, whatever N is
    assert counter.calls <= 3 + SAMPLED_FILES + 30 < len(ds), counter.calls
    monkeypatch.undo()
    before = _content(ds, 16, None)
    (root / "c1" / "new.jpg").write_bytes(
        (root / "c1" / "00001.jpg").read_bytes()
    )  # its folder's mtime moves
    assert _content(JpegFolder(str(root)), 16, None) != before


class _Tiny:
    """A map-style dataset of ``n`` 8x8 images that holds no per-sample object itself."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((8, 8, 3), i % 251, dtype=np.uint8), i % 7


def _held_after_first_batch(n: int) -> tuple[int, int]:
    """(bytes, blocks) traced as live once the first batch is out, with the loader and its iterator still held."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        loader = make_loader(_Tiny(n), 32, crop=8, num_workers=0, seed=3)
        it = iter(loader)
        next(it)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    diff = after.compare_to(before, "filename")
    del it, loader
    return sum(d.size_diff for d in diff), sum(d.count_diff for d in diff)


def test_the_loaders_main_process_holds_no_python_object_per_sample():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _held_after_first_batch(1_000)  # imports and first-use caches
        small_bytes, small_blocks = _held_after_first_batch(1_000)
        big_bytes, big_blocks = _held_after_first_batch(200_000)
    per_sample = (big_bytes - small_bytes) / 199_000
    # one int64 permutation per epoch (8 B/sample) is the only O(N) state; a Python int per sample is 28 B + 8
    assert per_sample <= 16, f"{per_sample:.1f} B per sample"
    assert big_blocks - small_blocks < 1_000, f"{big_blocks - small_blocks} more live allocations at 200K"
