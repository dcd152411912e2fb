"""Pack throughput and storage overhead per format, random reads loose vs packed, decode img/s per backend.

Runs on the real-photo set from ``make data`` (wallpaper crops, 512-1024 px JPEGs). Writes
``results/<cpu class>/pack_and_decode.jsonl`` (one row per measurement, with the environment) and ``results/<cpu class>/pack_and_decode.md``.
Timings of alternatives are interleaved rounds (``ptt.compare``): ratios are paired per round, median and IQR.
Run with ``make bench-pack`` (under ``flock /tmp/ptt-bench.lock`` so benchmarks do not overlap).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from pytorchtricks.clock import compare, environment, time_call, write_jsonl
from pytorchtricks.data.decode import available_backends, decode_image, image_size
from pytorchtricks.data.photoset import build_photo_set
from pytorchtricks.data.sources import list_source
from pytorchtricks.hardware import cpu_caps
from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.writer import pack


def _subset_csv(photos: str, n: int, work: str) -> tuple[str, list[str]]:
    src = list_source(photos)
    if len(src.paths) < n:
        raise SystemExit(f"{photos} has {len(src.paths)} photos, fewer than --n {n}; run `make data`.")
    pick = np.random.default_rng(0).permutation(len(src.paths))[:n]
    path = os.path.join(work, "subset.csv")
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "label"])
        for i in sorted(pick.tolist()):
            w.writerow([os.path.abspath(src.paths[i]), src.classes[src.labels[i]]])
    return path, [src.paths[i] for i in sorted(pick.tolist())]


def bench_pack(src_csv: str, work: str, workers: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    rows, dsts = [], {}
    for fmt in ("ptt", "tar", "lmdb"):
        dst = os.path.join(work, fmt)
        s, sec = time_call(lambda dst=dst, fmt=fmt: pack(src_csv, dst, format=fmt, workers=workers))
        payload, out = s["payload_bytes"], s["bytes_out"]
        rows.append({
            "bench": "pack", "format": fmt, "images": s["count"], "workers": workers, "seconds": sec,
            "images_per_s": s["count"] / sec, "bytes_in": s["bytes_in"], "payload_bytes": payload,
            "bytes_out": out, "overhead": (out - payload) / payload, "shards": len(s["shards"]),
            "rejects": len(s["rejects"]),
        })  # fmt: skip
        print(f"pack {fmt}: {s['count']} images in {sec:.1f} s ({s['count'] / sec:.0f}/s), "
              f"overhead {(out - payload) / payload:.3%}")  # fmt: skip
        dsts[fmt] = dst
    return rows, dsts


def bench_read(files: list[str], dsts: dict[str, str], n: int, rounds: int) -> list[dict[str, Any]]:
    order = np.random.default_rng(1).permutation(len(files))[:n]
    ptt, lmdb = ShardDataset(dsts["ptt"], decode=None), ShardDataset(dsts["lmdb"], decode=None)

    def loose() -> int:
        total = 0
        for i in order:
            with open(files[i], "rb") as fh:
                total += len(fh.read())
        return total

    def packed(ds: ShardDataset) -> int:
        return sum(len(ds.read_raw(int(i))[0]) for i in order)

    c = compare({"baseline": loose, "ptt": lambda: packed(ptt), "lmdb": lambda: packed(lmdb)}, rounds=rounds,
                min_run_time_s=0.2)  # fmt: skip
    rows = []
    for name, v in c.variants.items():
        rows.append({"bench": "read", "variant": "loose files" if name == "baseline" else name, "samples": n,
                     "median_s": v.stats.median_s, "samples_per_s": n / v.stats.median_s,
                     "ratio_vs_loose": v.ratio, "ratio_q1": v.ratio_q1, "ratio_q3": v.ratio_q3})  # fmt: skip
        print(f"read {name}: {n / v.stats.median_s:.0f} samples/s (x{v.ratio:.2f} vs loose files)")
    return rows


def bench_decode(files: list[str], n: int, rounds: int) -> list[dict[str, Any]]:
    datas = []
    for f in files[:: max(1, len(files) // n)][:n]:  # spread over every class and source photo
        with open(f, "rb") as fh:
            datas.append(fh.read())
    boxes = []
    for d in datas:  # a centre square, as a RandomResizedCrop box of scale ~0.56-0.75 would be
        h, w = image_size(d)
        s = min(h, w)
        boxes.append(((h - s) // 2, (w - s) // 2, s, s))
    rows = []
    for be in available_backends():
        variants = {
            "baseline": lambda be=be: [decode_image(d, backend=be) for d in datas],
            "full+crop+resize": lambda be=be: [_full_then_resize(d, b, be) for d, b in zip(datas, boxes)],
            "scaled 224 crop": lambda be=be: [decode_image(d, size=(224, 224), crop=b, backend=be)
                                              for d, b in zip(datas, boxes)],
        }  # fmt: skip
        c = compare(variants, rounds=rounds, min_run_time_s=0.2)
        for name, v in c.variants.items():
            rows.append({"bench": "decode", "backend": be, "variant": "full decode" if name == "baseline" else name,
                         "images": len(datas), "median_s": v.stats.median_s,
                         "images_per_s": len(datas) / v.stats.median_s, "ratio_vs_full": v.ratio,
                         "ratio_q1": v.ratio_q1, "ratio_q3": v.ratio_q3})  # fmt: skip
            print(f"decode {be} {name}: {len(datas) / v.stats.median_s:.0f} img/s (x{v.ratio:.2f} vs full)")
    return rows


def _full_then_resize(data: bytes, box: tuple[int, int, int, int], backend: str) -> np.ndarray:
    from pytorchtricks.data.decode import resize_array

    # the whole image decoded, then cut (with backend="roi", crop= would decode only a window)
    top, left, h, w = box
    return resize_array(decode_image(data, backend=backend)[top : top + h, left : left + w], (224, 224))


CONDITIONS = """
Conditions: shared 2-core VM (other work ran alongside; ratios come from interleaved rounds, absolute rates are
pessimistic). Photos: 5,000 of the 10,000 built by `make data` (crops of Debian wallpapers, 512-1024 px long side,
JPEG q80-95). Pack rates include a strict full decode of every file (the integrity check). Decode: 100 photos spread
over all classes, one thread (torch and OpenCV), target a centre square crop resized to 224x224; "full+crop+resize"
is the same output made from a full-size decode (area resize), "scaled 224 crop" is
`decode_image(size=(224, 224), crop=box)`."""


def to_markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    out = [f"# pack_and_decode\n\n{env['cpu']}, {env['cpu_count']} cores, torch {env['torch']}, "
           f"git {env['git_sha']}, {env['time_utc']}. Ratios: paired per interleaved round, median (IQR).\n"]  # fmt: skip
    out += ["## Pack (real-photo JPEGs)\n", "| format | images | workers | images/s | MB in | payload MB | MB out "
            "| overhead vs payload | shards |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["bench"] == "pack":
            out.append(f"| {r['format']} | {r['images']} | {r['workers']} | {r['images_per_s']:.0f} | "
                       f"{r['bytes_in'] / 1e6:.1f} | {r['payload_bytes'] / 1e6:.1f} | {r['bytes_out'] / 1e6:.1f} | "
                       f"{r['overhead']:.3%} | {r['shards']} |")  # fmt: skip
    out += ["\n## Random reads (bytes + label, warm page cache)\n", "| source | samples/s | ratio vs loose files |",
            "|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["bench"] == "read":
            out.append(f"| {r['variant']} | {r['samples_per_s']:.0f} | {r['ratio_vs_loose']:.2f} "
                       f"({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}) |")  # fmt: skip
    out += [
        "\n## Decode (one thread)\n",
        "| backend | variant | img/s | ratio vs full decode |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r["bench"] == "decode":
            out.append(f"| {r['backend']} | {r['variant']} | {r['images_per_s']:.0f} | {r['ratio_vs_full']:.2f} "
                       f"({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}) |")  # fmt: skip
    out.append(CONDITIONS)
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", default="data/photos")
    p.add_argument("--n", type=int, default=5000, help="photos to pack (default: %(default)s)")
    p.add_argument("--read-n", type=int, default=1000)
    p.add_argument("--decode-n", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class))
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    try:  # decode and resize on one thread, as inside a DataLoader worker
        import cv2

        cv2.setNumThreads(1)
    except ImportError:
        pass
    if not os.path.exists(os.path.join(args.photos, ".photoset.json")):
        build_photo_set(args.photos, max(args.n, 10_000))
    env = environment("cpu")
    work = tempfile.mkdtemp(prefix="ptt-bench-pack-")
    try:
        src_csv, files = _subset_csv(args.photos, args.n, work)
        rows, dsts = bench_pack(src_csv, work, args.workers)
        rows += bench_read(files, dsts, args.read_n, args.rounds)
        rows += bench_decode(files, args.decode_n, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    jsonl = os.path.join(args.out, "pack_and_decode.jsonl")
    if os.path.exists(jsonl):
        os.remove(jsonl)
    write_jsonl(jsonl, [{**r, "env": env} for r in rows])
    with open(os.path.join(args.out, "pack_and_decode.md"), "w", encoding="utf-8") as fh:
        fh.write(to_markdown(rows, env))
    print(f"wrote {jsonl} and {args.out}/pack_and_decode.md")


if __name__ == "__main__":
    main()
