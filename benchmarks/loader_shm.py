"""What a loader's way of holding batches in flight costs: reused /dev/shm slots, one batch per worker (what a small
/dev/shm makes ``make_loader`` do), anonymous memory files (its fallback when even that does not fit), a fresh
/dev/shm buffer per batch (classification before the slots), and torchvision's DataLoader beside them.

Systems, each in its own child process over the same photos (``photoset.build_photo_set``: real photos of 512-1024
px), batch 64, RandomResizedCrop 224 + flip, 2 workers, 2 epochs:

- ``slots-p2``: ``ptt.make_loader`` as it is made where /dev/shm has room: reused /dev/shm slots, prefetch 2.
- ``slots-p1``: the same with one batch in flight per worker (``prefetch_factor=1``), the first step of the plan.
- ``memfd-p2``: the same with the slots in anonymous memory files (the plan's fallback; forced by a /dev/shm
  that reports no room).
- ``fresh-p2``: the same with a fresh /dev/shm buffer per batch (no slots: how classification batches went before).
- ``torchvision``: ``ImageFolder`` + v2 ``RandomResizedCrop(224)`` + flip, uint8, ``DataLoader`` (2 workers,
  prefetch 2): the stock loader, for scale.

Each runs with no step (the loader alone) and beside a device step that does not use the CPU (a sleep of the
loader's own batch time, measured first: the balanced point, where the depth of the queue matters most).
Rounds run the systems in rotating order (interleaved); ratios against ``slots-p2`` are per round, then median
and min-max. Only ``pytorchtricks.clock`` reads a clock.

    make bench-loader-shm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from _child import emit, run_child  # benchmarks/ is on sys.path: these run as scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, WORKERS, CROP = 64, 2, 224
SYSTEMS = {
    "slots-p2": "ptt.make_loader: reused /dev/shm slots, prefetch_factor 2 (where /dev/shm has room)",
    "slots-p1": "ptt.make_loader, prefetch_factor 1: one batch in flight per worker (a small /dev/shm's plan)",
    "memfd-p2": "ptt.make_loader, slots in anonymous memory files, prefetch_factor 2 (the plan's fallback)",
    "fresh-p2": "ptt.make_loader, a fresh /dev/shm buffer per batch (no slots), prefetch_factor 2",
    "torchvision": "torchvision ImageFolder + v2 RandomResizedCrop(224) + flip, uint8, DataLoader prefetch 2",
}
BASE = "slots-p2"


def _loader(system: str, folder: str) -> Any:
    import warnings

    import pytorchtricks as ptt

    if system == "torchvision":
        import torch
        import torchvision
        from torchvision.transforms import v2 as T

        tf = T.Compose([T.PILToTensor(), T.RandomResizedCrop(CROP, antialias=True), T.RandomHorizontalFlip()])
        ds = torchvision.datasets.ImageFolder(folder, tf)
        return torch.utils.data.DataLoader(
            ds, BATCH, shuffle=True, drop_last=True, num_workers=WORKERS, persistent_workers=True
        )
    if system == "memfd-p2":  # a /dev/shm that reports no room: the plan takes memory files
        import pytorchtricks.data.shm as shm

        shm.shm_space = lambda path=shm.SHM_DIR: shm.ShmSpace(path, shm.RESERVE_BYTES, shm.RESERVE_BYTES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = ptt.make_loader(
            ptt.JpegFolder(folder), BATCH, crop=CROP, num_workers=WORKERS,
            prefetch_factor=1 if system == "slots-p1" else 2,
        )  # fmt: skip
    if system == "memfd-p2":
        assert loader.shm is not None and loader.shm.backing == "memfd"
    if system == "fresh-p2":
        loader.dataloader.dataset.slots = None  # before the workers start: they build fresh buffers
    return loader


def run_one(system: str, folder: str, epochs: int, step_s: float) -> dict[str, Any]:
    import time

    import torch

    from pytorchtricks.clock import now_s

    torch.set_num_threads(1)
    loader = _loader(system, folder)
    times, counts = [], []
    for _ in range(epochs):
        t0, n = now_s(), 0
        for x, _ in loader:
            n += int(x.shape[0])
            if step_s:
                time.sleep(step_s)  # the device's step: the CPU stays with the workers
            del x
        times.append(now_s() - t0)
        counts.append(n)
    return {
        "system": system,
        "step_s": step_s,
        "epoch_s": times,
        "images": counts,
        "images_per_s": [c / t for c, t in zip(counts, times, strict=True)],
    }


def _ratios(rows: list[dict[str, Any]], a: str, b: str, step: str) -> list[float]:
    by = {
        (r["round"], r["system"]): r["images_per_s"][-1]
        for r in rows
        if "images_per_s" in r and r["mode"] == step
    }
    rounds = sorted({r["round"] for r in rows})
    return [by[(k, a)] / by[(k, b)] for k in rounds if (k, a) in by and (k, b) in by]


def markdown(rows: list[dict[str, Any]], n: int, env: dict[str, Any], step_s: float) -> str:
    rounds = sorted({r["round"] for r in rows})
    out = [
        f"# Batches in flight: {n} photos of 512-1024 px, batch {BATCH}, RandomResizedCrop {CROP}, {WORKERS} workers",
        "",
        f"{env.get('cpu')} ({env.get('cpu_count')} cores, class {env.get('cpu_class')}), torch {env.get('torch')}, "
        f"{env.get('time_utc')}, git {env.get('git_sha')}; {len(rounds)} interleaved round(s), 2 epochs each, "
        f"epoch 2 counted; load average at the start {env.get('loadavg_1m_at_start')}. The device step is a sleep "
        f"of {step_s * 1e3:.0f} ms per batch (the loader's own batch time, measured first).",
        "",
        "| system | alone: img/s (median, min-max) | beside the step: img/s | alone vs slots-p2 | beside vs slots-p2 |",
        "|---|---|---|---|---|",
    ]
    for s in SYSTEMS:
        cells = []
        for mode in ("alone", "step"):
            v = [
                r["images_per_s"][-1]
                for r in rows
                if r["system"] == s and r["mode"] == mode and "images_per_s" in r
            ]
            cells.append(f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" if v else "-")
        for mode in ("alone", "step"):
            q = _ratios(rows, s, BASE, mode)
            cells.append(f"{statistics.median(q):.3f}x ({min(q):.3f}-{max(q):.3f})" if q else "-")
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    errors = {r["system"]: r["error"] for r in rows if "error" in r}
    out += ["", "Systems:", ""] + [f"- `{s}`: {d}" for s, d in SYSTEMS.items()]
    if errors:
        out += ["", "Errors:", ""] + [f"- `{s}`: {e}" for s, e in errors.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--images", type=int, default=640)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--work", default="/tmp/ptt-bench-data")
    from pytorchtricks.hardware import cpu_caps

    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class))
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--step-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        emit(run_one(args.run_one, args.folder, args.epochs, args.step_s))
        return 0

    from pytorchtricks.clock import environment, write_results
    from pytorchtricks.data.photoset import build_photo_set

    folder = os.path.join(args.work, f"photos-{args.images}")
    build_photo_set(folder, args.images, workers=WORKERS)
    env = environment()
    env["cpu_class"] = cpu_caps().cpu_class
    env["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)

    def child(s: str, step_s: float) -> dict[str, Any]:
        cmd = [sys.executable, os.path.abspath(__file__), "--run-one", s, "--folder", folder]
        return run_child([*cmd, "--epochs", str(args.epochs), "--step-s", str(step_s)], args.timeout_s, ROOT)

    first = child(BASE, 0.0)  # the loader's own batch time: the balanced device step
    if "error" in first:
        print(first["error"], file=sys.stderr)
        return 1
    step_s = BATCH / first["images_per_s"][-1]
    systems = list(SYSTEMS)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for s in systems[r % len(systems) :] + systems[: r % len(systems)]:
            for mode, st in (("alone", 0.0), ("step", step_s)):
                row = {"system": s, "round": r, "mode": mode, **child(s, st)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    md = markdown(rows, args.images, env, step_s)
    write_results(os.path.join(args.out, "loader_shm"), [{**x, "env": env} for x in rows], md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
