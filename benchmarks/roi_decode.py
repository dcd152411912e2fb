"""Decode only: the region-of-interest JPEG decode vs the whole-image scaled decode, on the same crops, one thread.

Each photo gets one RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3, seeded) and is decoded to 224x224 by
``decode_image`` with ``backend="roi"`` (the crop's window at the DCT scale) and with the fallback backend (the
whole image at the same scale, then the crop and resize): the pixels are the same (tests/data/test_decode_roi.py),
the work is not. A third path, ``floor``, reads every photo whole at libjpeg-turbo's smallest DCT scale (1/8,
simplejpeg ``min_height=min_width=1``): Huffman decoding of every coefficient plus a 1/64-size output - what any
exact decode of a baseline JPEG must spend before its last needed row, so no window can beat it by more than the
share of rows below the crop. Interleaved rounds (``clock.compare``), median and IQR; megapixels/s counts the source image's
pixels (what a full decode would have to produce), and the decoded megapixels per sample say what each path
actually produced.

    make bench-roi-decode
    .venv/bin/python benchmarks/roi_decode.py --photos /path/to/photos --n 200 --rounds 5
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    from pytorchtricks.clock import compare, environment, write_results
    from pytorchtricks.data import decode
    from pytorchtricks.data.images import rrc_box
    from pytorchtricks.data.photoset import build_photo_set
    from pytorchtricks.hardware import cpu_caps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--photos", default=None, help="a folder of JPEGs (default: a 2 MP set built under --work)"
    )
    ap.add_argument("--min-mp", type=float, default=2.0)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="/tmp/ptt-bench-data")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class))
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--tag", default=None, help="results name part (default: '<min-mp>mp')")
    args = ap.parse_args(argv)
    photos = args.photos
    if photos is None:
        photos = os.path.join(args.work, f"hires-{args.min_mp:g}mp-{args.n}")
        build_photo_set(photos, args.n, min_mp=args.min_mp, workers=2)
    files = sorted(glob.glob(os.path.join(photos, "**", "*.jpg"), recursive=True))[: args.n]
    if not files:
        raise SystemExit(f"no .jpg files under {photos}")
    data = []
    for path in files:
        with open(path, "rb") as fh:
            data.append(fh.read())
    rng = np.random.default_rng(0)
    jobs = []
    for raw in data:
        h, w = decode.image_size(raw)
        jobs.append((raw, rrc_box(h, w, (0.08, 1.0), (3 / 4, 4 / 3), rng), h * w))
    source_mp = sum(px for _, _, px in jobs) / 1e6
    fallback = decode.fallback_backend()

    def run(backend: str) -> None:
        for raw, box, _ in jobs:
            decode.decode_image(raw, size=(224, 224), crop=box, backend=backend)

    def floor() -> None:
        import simplejpeg

        for raw, _, _ in jobs:
            simplejpeg.decode_jpeg(raw, colorspace="RGB", min_height=1, min_width=1)

    decoded = {}
    for name, backend in (("window", "roi"), ("whole", fallback)):
        decode.reset_decode_stats()
        run(backend)
        st = decode.decode_stats()
        decoded[name] = {"decoded_mp_per_sample": st["decoded_px"] / len(jobs) / 1e6, **st}
    res = compare(
        {"baseline": lambda: run(fallback), "window": lambda: run("roi"), "floor": floor},
        rounds=args.rounds,
        warmup=0,
        min_run_time_s=0.0,
        num_threads=1,
        single_call=("baseline", "window", "floor"),  # one pass over the photos per block (seconds each)
    )
    env = environment()
    env["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    rows = []
    decoded["floor"] = {
        "decoded_mp_per_sample": sum(px for _, _, px in jobs) / 64 / len(jobs) / 1e6,
        "fallback": {},
    }
    for name, label in (("baseline", "whole"), ("window", "window"), ("floor", "floor")):
        v = res[name]
        rows.append(
            {
                "path": label,
                "backend": {"window": "roi", "floor": "simplejpeg 1/8, whole"}.get(name, fallback),
                "images": len(jobs),
                "median_s": v.stats.median_s,
                "q1_s": v.stats.q1_s,
                "q3_s": v.stats.q3_s,
                "images_per_s": len(jobs) / v.stats.median_s,
                "source_mp_per_s": source_mp / v.stats.median_s,
                "speedup": v.ratio,
                "speedup_q1": v.ratio_q1,
                "speedup_q3": v.ratio_q3,
                "decoded_mp_per_sample": decoded[label]["decoded_mp_per_sample"],
                "fallback": decoded[label]["fallback"],
                "rounds": res.rounds,
                "env": env,
            }
        )
    md = [
        f"# Decode only: {len(jobs)} photos ({source_mp / len(jobs):.1f} MP mean), one RandomResizedCrop each -> "
        "224x224, one thread",
        "",
        f"{env.get('cpu')}, {env.get('time_utc')}, git {env.get('git_sha')}; load average at the start "
        f"{env['loadavg_1m_at_start']}. Medians of {res.rounds} interleaved rounds (IQR in brackets).",
        "",
        "| path | images/s | source MP/s | decoded MP / sample | x whole (IQR) | fallbacks |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['path']} ({r['backend']}) | {r['images_per_s']:.1f} | {r['source_mp_per_s']:.0f} | "
            f"{r['decoded_mp_per_sample']:.3f} | {r['speedup']:.2f} ({r['speedup_q1']:.2f}-{r['speedup_q3']:.2f}) "
            f"| {json.dumps(r['fallback']) if r['fallback'] else '-'} |"
        )
    fl = next(r for r in rows if r["path"] == "floor")
    read = float(np.mean([(box[0] + box[2]) / decode.image_size(raw)[0] for raw, box, _ in jobs]))
    md += [
        "",
        f"The floor: {fl['images_per_s']:.0f} photos/s on one core only to entropy-decode them whole (no crop, no "
        f"resize, 1/64 of the pixels). The window stops after its crop's last row ({read:.0%} of the rows on "
        f"average here), so 2 decoding workers on these files are capped near "
        f"{2 * fl['images_per_s'] / read:.0f} images/s, whatever happens after the Huffman decode.",
    ]
    if args.note:
        md += ["", "Notes:", ""] + [f"- {x}" for x in args.note]
    os.makedirs(args.out, exist_ok=True)
    tag = args.tag or f"{args.min_mp:g}mp"
    write_results(os.path.join(args.out, f"roi_decode-{tag}-{len(jobs)}"), rows, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
