"""Pack an image folder into contiguous shards once (ptt, WebDataset tar or LMDB), with fixed preprocessing.

Why: millions of small files cost one open/read/close and a filesystem lookup each, and fixed preprocessing (resize
to the training resolution) is redone every epoch. One pass writes contiguous shards - optionally already resized
or decoded - with an index for O(1) random access, CRC32 per record and sha256 per shard.
When: datasets of many small images read for several epochs, network or spinning storage, many DataLoader
workers, or DDP ranks that must split samples exactly.
Caveats: ``--raw`` trades disk (about 10x a JPEG) for no decode at all; resizing at pack time fixes the largest
resolution you can train at; tar shards are sequential (use ShardStream), ptt and lmdb allow random access.
See also: ShardDataset, ShardStream, decode_image, 预处理提速 / IO 提速.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from pytorchtricks.core import BenchCase, TrickInfo
from pytorchtricks.shards.writer import pack

__all__ = ["pack"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=True, needs=("data",))


def _loose_files(root: str, n: int) -> str:
    """An ImageFolder of ``n`` real-photo JPEGs (wallpaper crops), built deterministically."""
    from pytorchtricks.shards.photoset import build_photo_set

    build_photo_set(root, n, seed=0, workers=1, max_sources=6)
    return root


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Read N samples (bytes + label) from loose files vs from a packed ptt dataset, in a random order."""
    import numpy as np

    from pytorchtricks.shards.dataset import ShardDataset
    from pytorchtricks.shards.sources import list_source

    n = 64 if size == "smoke" else 2000
    work = tempfile.mkdtemp(prefix="ptt-pack-bench-")
    src = _loose_files(os.path.join(work, "photos"), n)
    dst = os.path.join(work, "packed")
    pack(src, dst, format="ptt", workers=1 if size == "smoke" else None)
    listing = list_source(src)
    ds = ShardDataset(dst, decode=None)
    order = np.random.default_rng(0).permutation(len(ds))

    def loose() -> int:
        total = 0
        for i in order:
            with open(listing.paths[i], "rb") as fh:
                total += len(fh.read()) + listing.labels[i]
        return total

    def packed() -> int:
        total = 0
        for i in order:
            data, label, _ = ds.read_raw(int(i))
            total += len(data) + label
        return total

    def check(a: int, b: int) -> None:
        if a != b:
            raise AssertionError(f"packed reads differ from loose files: {a} != {b} bytes+labels")

    return BenchCase(
        baseline=loose,
        treated=packed,
        items_per_call=len(order),
        unit="samples",
        device="cpu",
        description=f"read {len(order)} JPEGs + labels in random order: loose files vs one ptt pack (warm cache)",
        check=check,
        cleanup=lambda: shutil.rmtree(work, ignore_errors=True),
    )
