"""``ptt pack`` and ``ptt inspect``: writing and checking shard packs, local or on object storage."""

from __future__ import annotations

import argparse
import os
from typing import Any

from pytorchtricks.cli._common import _console, add_split
from pytorchtricks.core import PttError


def _add_pack(sub: Any) -> None:
    p = sub.add_parser(
        "pack", help="pack an image folder, CSV/JSONL list or detection root into ptt/tar/lmdb shards"
    )
    p.add_argument(
        "src",
        help="ImageFolder tree (a folder per class), a .csv/.jsonl list of path,label, or a detection root "
        "(COCO annotations/instances_*.json or the JSON itself, YOLO images/+labels/, VOC Annotations/+JPEGImages/)",
    )
    p.add_argument(
        "dst",
        help="output folder or bucket URL (s3://bucket/p, gs://, az://); re-running resumes an interrupted pack",
    )
    add_split(p)
    p.add_argument("--format", default="ptt", choices=("ptt", "tar", "lmdb"))
    p.add_argument("--resize", type=int, default=None, metavar="SHORT_SIDE", help="shrink the short side")
    p.add_argument("--max-side", type=int, default=None, metavar="N", help="shrink the long side to this")
    p.add_argument("--quality", type=int, default=None, help="re-encode JPEG at this quality")
    p.add_argument("--raw", action="store_true", help="store decoded uint8 pixels (no decode when reading)")
    p.add_argument("--shard-size", default="64MB", help="bytes per shard (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the listing order (no seeded permutation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail on the first bad file instead of listing it")
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        metavar="N",
        help="refuse (list in rejects) images whose header declares more pixels, before decoding (default: 178956970)",
    )
    p.add_argument("--verify", action="store_true", help="re-read every shard and record after packing")
    p.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: every rank writes its own chunks' shards, rank 0 merges index and manifest "
        "(chunk-aligned: the same bytes at any world size)",
    )
    p.add_argument(
        "--staging-dir",
        default=None,
        help="local folder a bucket DST is packed in before the upload (--distributed: one shard at a time)",
    )
    p.set_defaults(handler=_cmd_pack)


def _cmd_pack(args: argparse.Namespace) -> int:
    from pytorchtricks.tricks.data.pack import pack

    s = pack(
        args.src, args.dst, format=args.format, resize=args.resize, max_side=args.max_side, quality=args.quality,
        raw=args.raw, shard_size=args.shard_size, workers=args.workers, shuffle=not args.no_shuffle, seed=args.seed,
        strict=args.strict, verify=args.verify, progress=not args.distributed,
        distributed=args.distributed, staging_dir=args.staging_dir, split=args.split,
        **({"max_pixels": args.max_pixels} if args.max_pixels is not None else {}),
    )  # fmt: skip
    if args.distributed and os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 reports
    console = _console()
    rate = s.get("images_per_s")
    console.print(
        f"packed {s['count']} of {s['files_in']} files into {len(s['shards'])} {s['format']} shard(s) in {args.dst}: "
        f"{s['bytes_in'] / 1e6:.1f} MB in, {s['bytes_out'] / 1e6:.1f} MB out"
        + (f", {rate:.0f} images/s" if rate else " (already complete)")
        + (f", {s['skipped_shards']} shard(s) kept from an earlier run" if s.get("skipped_shards") else ""),
        highlight=False,
    )
    rejects = s.get("rejects", [])
    note = " (listed in manifest.json)" if rejects else ""
    console.print(f"rejects: {len(rejects)}{note}", highlight=False)
    for r in rejects[:10]:
        console.print(f"  {r['path']}: {r['reason']}", highlight=False, markup=False)
    return 0


def _add_cache_options(p: Any) -> None:
    p.add_argument(
        "--cache-dir",
        default=None,
        help="node-shared shard cache for URLs (default: $PTT_CACHE_DIR/shards or ~/.cache/pytorchtricks/shards)",
    )
    p.add_argument(
        "--cache-limit", default=None, help="bound of the shard cache in bytes, e.g. 50GB (default: none)"
    )


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect", help="counts, class histogram, sizes and checksums of a pack (or of a detection root)"
    )
    p.add_argument(
        "dst",
        help="a folder written by `ptt pack`, or its URL (s3://bucket/p, gs://, az://, https://); or a COCO / "
        "YOLO / VOC root, before it is packed",
    )
    add_split(p)
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the sha256/CRC32 check (a detection root: the check of each file's size against its annotation)",
    )
    _add_cache_options(p)
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.set_defaults(handler=_cmd_inspect)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from rich.table import Table

    from pytorchtricks.data.detection import detection_layout
    from pytorchtricks.shards.inspect import inspect_shards

    if not os.path.isfile(os.path.join(args.dst, "manifest.json")) and detection_layout(args.dst) is not None:
        return _inspect_root(args)
    if args.split is not None:
        raise PttError(
            f"{args.dst} is a pack: it holds the one split it was packed from; leave out --split (it picks the "
            "split of a COCO / YOLO / VOC root)."
        )
    r = inspect_shards(
        args.dst,
        verify=not args.no_verify,
        decode=args.decode,
        cache_dir=args.cache_dir,
        cache_limit=args.cache_limit,
    )
    console = _console()
    over = r["overhead"]
    console.print(
        f"{r['path']}: {r['format']}, {r['count']} samples in {r['shards']} shard(s), "
        f"{r['bytes_out'] / 1e6:.1f} MB ({r['payload_bytes'] / 1e6:.1f} MB payload"
        + (f", overhead {over:.2%}" if over is not None else "")
        + f"), {len(r['rejects'])} rejects",
        highlight=False,
    )
    det = r.get("detection")
    if det is None:
        table = Table(title="classes")
        table.add_column("class")
        table.add_column("samples", justify="right")
        for name, n in r["classes"].items():
            table.add_row(name, str(n))
        console.print(table)
    else:
        _print_detection(console, det)
    if r["problems"] is None:
        return 0
    for p in r["problems"]:
        console.print(f"problem: {p}", highlight=False, markup=False)
    console.print("integrity: ok" if not r["problems"] else f"integrity: {len(r['problems'])} problem(s)")
    return 1 if r["problems"] else 0


def _inspect_root(args: argparse.Namespace) -> int:
    """``ptt inspect`` on a detection root: the split read, its boxes and sizes, bad annotations, bad files."""
    from pytorchtricks.shards.inspect import inspect_detection_root

    r = inspect_detection_root(args.dst, split=args.split, verify=not args.no_verify, decode=args.decode)
    console = _console()
    split = f", split {r['split']}" + (f" (splits: {', '.join(r['splits'])})" if len(r["splits"]) > 1 else "")
    console.print(
        f"{r['path']}: a {r['format'].upper()} root{split if r['split'] else ''}, {r['count']} images, "
        f"{len(r['rejects'])} bad annotation(s)",
        highlight=False,
        markup=False,
    )
    _print_detection(console, r["detection"])
    for x in r["rejects"][:10]:
        ann = f", annotation {x['annotation']}" if x.get("annotation") is not None else ""
        console.print(f"  reject: {x['file']}{ann}: {x['reason']}", highlight=False, markup=False)
    if len(r["rejects"]) > 10:
        console.print(f"  ... and {len(r['rejects']) - 10} more (ptt pack lists them all in its manifest)")
    if r["problems"] is None:
        return 0
    for p in r["problems"]:
        console.print(f"problem: {p}", highlight=False, markup=False)
    console.print("files: ok" if not r["problems"] else f"files: {len(r['problems'])} problem(s)")
    return 1 if r["problems"] else 0


def _print_detection(console: Any, det: dict[str, Any]) -> None:
    from rich.table import Table

    bpi, h, w, mp = det["boxes_per_image"], det["height"], det["width"], det["megapixels"]
    console.print(
        f"detection ({det['format']}): {det['images']} images ({det['images_without_boxes']} without boxes), "
        f"{det['boxes']} boxes; boxes per image min {bpi.get('min')} median {bpi.get('median')} max "
        f"{bpi.get('max')}; image sizes (stored) {w.get('min')}-{w.get('max')} x {h.get('min')}-{h.get('max')} px "
        f"(median {w.get('median')} x {h.get('median')}), {mp.get('min', 0):.2f}-{mp.get('max', 0):.2f} MP",
        highlight=False,
    )
    table = Table(title="boxes per class")
    table.add_column("class")
    table.add_column("boxes", justify="right")
    for name, n in det["boxes_per_class"].items():
        table.add_row(str(name), str(n))
    console.print(table)
