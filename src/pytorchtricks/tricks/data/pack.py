"""Pack an image folder into contiguous shards once (ptt, WebDataset tar or LMDB), with fixed preprocessing.

Why: millions of small files cost one open/read/close and a filesystem lookup each, and fixed preprocessing (resize
to the training resolution) is redone every epoch. One pass writes contiguous shards - optionally already resized
or decoded - with an index for O(1) random access, CRC32 per record and sha256 per shard.
When: datasets of many small images read for several epochs, network or spinning storage, many DataLoader
workers, or DDP ranks that must split samples exactly.
Caveats: ``--raw`` trades disk (about 10x a JPEG) for no decode at all; resizing at pack time fixes the largest
resolution you can train at; tar shards are sequential (use ShardStream), ptt and lmdb allow random access.
Hostile input is listed in the manifest's ``rejects`` with the reason, never packed or waited on: FIFOs and devices,
images whose header declares more than ``max_pixels`` (178.9 MP), hidden or misplaced files; a killed pack (or a
killed worker: the pack fails at once) resumes byte-identically when the same command is run again.
See also: ShardDataset, ShardStream, decode_image, 预处理提速 / IO 提速.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from typing import Any

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.shards.writer import PackConfig, pack
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup, TuneSkip, stored_side, unless_input_bound

__all__ = ["PackConfig", "pack"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=True, needs=("data",))


def _tune_applies(facts: TuneFacts) -> str | None:
    return unless_input_bound(facts, ("files",))


def _tune_pack(setup: TuneSetup, resize: int | None) -> dict[str, Any]:
    """Pack what tune sees into its cache folder once (reused by later runs); returns the pack's path and the
    seconds its build took (recorded beside it, so a reused pack still reports its cost)."""
    if setup.source is None:
        raise TuneSkip("no source folder to pack")
    key = hashlib.sha256(
        (
            f"{os.path.abspath(setup.source)}|{len(setup.dataset)}|{resize}|{setup.task}"
            + (f"|{setup.split}" if setup.split else "")
        ).encode()
    ).hexdigest()[:12]
    dst = os.path.join(setup.cache_dir, f"tune-pack-{key}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoEffectWarning)  # "already holds this pack": reused, said below
        try:  # shuffle=False: sample i of the pack is file i of the folder (the data check compares pixels)
            summary = pack(setup.source, dst, resize=resize, workers=2, shuffle=False, split=setup.split)
        except PttError as exc:
            raise TuneSkip(f"ptt pack failed: {exc}") from exc
    side = dst + ".build.json"
    if "elapsed_s" in summary:
        with open(side + ".tmp", "w", encoding="utf-8") as fh:
            json.dump({"build_s": summary["elapsed_s"], "bytes_out": summary["bytes_out"]}, fh)
        os.replace(side + ".tmp", side)
        build_s, reused = float(summary["elapsed_s"]), False
    else:
        with open(side, encoding="utf-8") as fh:
            build_s, reused = float(json.load(fh)["build_s"]), True
    size = int(summary["bytes_out"])
    setup.notes.append(
        f"the pack {'reused' if reused else 'written'} at {dst} ({size / 2**20:.0f} MiB) stays for later runs: "
        f"remove it with `rm -r {dst} {side}`"
    )
    return {"path": dst, "build_s": build_s, "reused": reused, "bytes": size}


def _tune_apply(setup: TuneSetup, state: dict[str, Any]) -> None:
    if (
        setup.task == "detection"
    ):  # a detection root packs with its boxes (scaled by --resize); our loader reads it
        from pytorchtricks.road import open_data

        setup.dataset, setup.loader = open_data(state["path"], task="detection"), "ptt"
        return
    from pytorchtricks.shards.dataset import ShardDataset

    setup.dataset, setup.loader = ShardDataset(state["path"]), "ptt"


def _stored_side(setup: TuneSetup) -> int:
    """The short side a resized pack keeps: a detector's training size (its transform's shortest side: the
    decode is then 1:1), or what RandomResizedCrop's smallest crop needs."""
    return setup.input_size if setup.task == "detection" else stored_side(setup.input_size)


TUNE = (
    TuneHook(
        changes="loader",
        check="data",
        receipt='ptt.pack(dataset.root, "pack-out"); dataset = ptt.ShardDataset("pack-out")  # once (reused after)',
        detection_receipt='ptt.pack(ROOT, "pack-out"{split_kw}); dataset = ptt.open_data("pack-out", '
        'task="detection")  # once (reused after): the JPEGs as they are, the targets as JSON',
        tasks=("classification", "detection"),
        apply=_tune_apply,
        applies=_tune_applies,
        prepare=lambda setup: _tune_pack(setup, None),
        cost="repack",
        order=101,
        requires=("make_loader",),
        bound="decoded pixels >= 30 dB PSNR vs PIL full decode",
        group="dataset",
    ),
    TuneHook(
        changes="loader",
        check="data",
        receipt='ptt.pack(dataset.root, "pack-out", resize={cache_side}); dataset = ptt.ShardDataset("pack-out")  # '
        "once; short side {cache_side}: the smallest crop keeps its pixels",
        detection_receipt='ptt.pack(ROOT, "pack-out", resize={input_size}{split_kw}); dataset = ptt.open_data('
        '"pack-out", task="detection")  # once; short side {input_size}: the training size, the boxes scaled with '
        "the images",
        tasks=("classification", "detection"),
        apply=_tune_apply,
        applies=_tune_applies,
        prepare=lambda setup: _tune_pack(setup, _stored_side(setup)),
        cost="repack",
        order=101,
        requires=("make_loader",),
        bound="decoded pixels >= 30 dB PSNR vs PIL full decode",
        group="dataset",
        variant="resize",
    ),
)


def _loose_files(root: str, n: int) -> str:
    """An ImageFolder of ``n`` real-photo JPEGs (wallpaper crops), built deterministically."""
    from pytorchtricks.data.photoset import build_photo_set

    build_photo_set(root, n, seed=0, workers=1, max_sources=6)
    return root


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Read N samples (bytes + label) from loose files vs from a packed ptt dataset, in a random order."""
    import numpy as np

    from pytorchtricks.data.sources import list_source
    from pytorchtricks.shards.dataset import ShardDataset

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
