"""Ten million images: every per-sample cost at 20K, 100K and 1M tiny JPEGs, its slope, and the 10M projection.

The set is N tiny JPEGs (80-128 x 64-96 px thumbnails of the wallpaper photos, ~2.5 KB, 100 classes; 256 distinct
encodings written round-robin, built once under ``--data``), so what shows is per-sample overhead, not decoding.
Each stage runs in a fresh interpreter (its imports warmed on a 2,000-image set first, so a stage's time and memory
are its own):

- ``imagefolder``: torchvision ``ImageFolder(src)`` (the reference) / ``jpegfolder``: ``ptt.JpegFolder(src)``;
  the median of 3 opens (the folder's entries in the kernel's cache after the first).
- ``pack``: ``ptt.pack(src, dst, workers=2)`` (the single-process pack).
- ``open``: ``ShardDataset(pack)``; ``loader``: ``make_loader(pack, 256, crop=32, num_workers=2)``: the first
  batch's latency, one epoch's images/s, and the main process's USS (psutil) at the first batch, its workers
  alive, less the same run's over the 2,000-image pack (per sample: that growth / (N - 2,000)).
- ``cache_build``: ``cache_in_ram(JpegFolder(src), 32)`` into a fresh folder on local disk, next to one epoch of
  ``make_loader(JpegFolder(src), 256, crop=32, num_workers=2)`` over the same files; ``cache_reopen``: the same
  call again on an open JpegFolder (the key check and the arena's own checks).
- ``inspect``: ``inspect_shards(pack)`` (sha256 of every shard, every record's CRC32 and metadata).
- ``dist_pack``: ``ptt pack --distributed`` under torchrun (gloo on 127.0.0.1) at 1, 2 and 4 ranks, one worker
  each (``--workers 0``): wall time, files/s per rank, the shard bytes each rank wrote, rank 0's merge time.

The per-sample slope of a stage between two sizes is (t(N2) - t(N1)) / (N2 - N1); the 10M projection extends the
largest measured size by the last slope. The machine is shared with other jobs (see ``--note``): times carry that.

    make bench-scale                                   # SCALE_SIZES="20000 100000"
    .venv/bin/python benchmarks/scale.py --sizes 20000 100000 1000000
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_N = 2000  # the warm-up / baseline set
CLASSES, POOL = 100, 256
STAGES = ("imagefolder", "jpegfolder", "pack", "open", "loader", "cache_build", "cache_reopen", "inspect")
LABELS = {
    "imagefolder": "torchvision `ImageFolder(src)` (reference)",
    "jpegfolder": "`ptt.JpegFolder(src)`",
    "pack": "`ptt.pack(src, dst, workers=2)`",
    "open": "`ShardDataset(pack)` open",
    "loader": "one make_loader epoch over the pack (crop 32, 2 workers)",
    "cache_build": "`cache_in_ram(JpegFolder(src), 32)` build",
    "cache_reopen": "`cache_in_ram` reopen (key check)",
    "inspect": "`ptt inspect` (sha256 + every record)",
}


def set_dir(root: str, n: int) -> str:
    return os.path.join(root, f"photo-n{n}")


def make_set(root: str, n: int) -> str:
    """``root/photo-n<N>``: N tiny JPEGs in 100 class folders, built once (a marker file says it is complete).

    The 256 distinct encodings are thumbnails of the installed wallpaper photos (a random crop of each, resized to
    80-128 x 64-96 px, quality 85: ~2.5 KB, as small photos are), so a 1M set (~4 GB on disk, its pack about as much)
    stays in a 24 GiB machine's page cache and each stage measures our per-sample work, not the disk. (An earlier
    pool of random-noise pixels encoded to ~9 KB a file; at 1M the set and its pack outgrew the page cache.)"""
    import numpy as np
    from PIL import Image

    from pytorchtricks.data.photoset import wallpaper_sources

    where = set_dir(root, n)
    if os.path.exists(os.path.join(where, ".complete")):
        return where
    shutil.rmtree(where, ignore_errors=True)
    rng = np.random.default_rng(0)
    sources = [path for _, path in wallpaper_sources()]
    if not sources:
        raise SystemExit(
            "no wallpaper photos installed: run `make system-deps` (Debian's wallpaper packages)."
        )
    pool = []
    for k in range(POOL):
        with Image.open(sources[k % len(sources)]) as im:
            im.draft("RGB", (512, 512))  # a DCT-scaled decode: the thumbnail needs no full-size pixels
            img = im.convert("RGB")
        h, w = int(rng.integers(64, 97)), int(rng.integers(80, 129))
        side = int(min(img.size) * rng.uniform(0.3, 1.0))
        x, y = int(rng.integers(0, img.size[0] - side + 1)), int(rng.integers(0, img.size[1] - side + 1))
        buf = io.BytesIO()
        img.crop((x, y, x + side, y + side)).resize((w, h), Image.Resampling.BILINEAR).save(
            buf, "JPEG", quality=85
        )
        pool.append(buf.getvalue())
    for c in range(CLASSES):
        os.makedirs(os.path.join(where, f"c{c:03d}"))
    for i in range(n):
        with open(os.path.join(where, f"c{i % CLASSES:03d}", f"{i:08d}.jpg"), "wb") as fh:
            fh.write(pool[i % POOL])
    with open(os.path.join(where, ".complete"), "w") as fh:  # hidden: not listed as a sample
        fh.write(str(n))
    return where


def _uss() -> int:
    import psutil

    return int(psutil.Process().memory_full_info().uss)


def _metered(fn: Any) -> tuple[Any, dict[str, Any]]:
    """``fn()`` timed, with the CPU-seconds this process and its workers spent on it (``clock.CpuMeter``) and the
    bytes the machine read from its disks meanwhile: a stage whose files no longer fit the page cache turns into
    disk reads, and its wall time then measures the disk; its CPU-seconds still measure our per-sample work."""
    import psutil

    from pytorchtricks.clock import CpuMeter, time_call

    d0 = psutil.disk_io_counters()
    with CpuMeter() as m:
        value, s = time_call(fn)
    d1 = psutil.disk_io_counters()
    use = m.result
    assert use is not None
    read = int(d1.read_bytes - d0.read_bytes) if d0 is not None and d1 is not None else None
    return value, {"s": s, "cpu_s": use.main_cpu_s + use.workers_cpu_s, "disk_read_bytes": read}


def _median_open(fn: Any) -> dict[str, Any]:
    """The median of 3 calls (wall), with the CPU-seconds and disk reads of that median call."""
    runs = sorted((_metered(fn)[1] for _ in range(3)), key=lambda r: r["s"])
    return runs[1]


def _epoch(loader: Any) -> tuple[float, float, int]:
    """(first batch s, whole epoch s, images) of one pass."""
    from pytorchtricks.clock import now_s

    t0, first, n = now_s(), None, 0
    for _, y in loader:
        n += len(y)
        if first is None:
            first = now_s() - t0
    return float(first or 0.0), now_s() - t0, n


def _warm(folder: str) -> dict[str, Any]:
    """Read every file under ``folder`` once, untimed by the stage: the stage then starts with its input in the page
    cache at every size, as the smaller sets always are. (On this VM the kernel dropped part of the 1M set between
    stages with memory to spare: a stage that found it cold spent its wall time and up to a third more CPU-seconds
    on disk reads, so its slope measured the disk.) Returns the warm-up's own seconds and disk reads."""

    def read_all() -> int:
        count, stack = 0, [folder]
        while stack:
            for e in os.scandir(stack.pop()):
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    with open(e.path, "rb") as fh:
                        while fh.read(1 << 22):
                            pass
                    count += 1
        return count

    files, m = _metered(read_all)
    return {"files": files, "s": m["s"], "disk_read_bytes": m["disk_read_bytes"]}


def stage(name: str, n: int, data: str, work: str) -> dict[str, Any]:
    """One stage at size ``n`` in this (fresh) process, after the same call on the 2,000-image set. The stages that
    read every sample (pack, loader, cache_build, inspect) first warm their input (``_warm``; in ``warm``)."""
    warnings.simplefilter("ignore")

    src, base = set_dir(data, n), set_dir(data, BASE_N)
    pack_dir = os.path.join(work, f"pack-{n}")
    warm = {"pack": src, "cache_build": src, "loader": pack_dir, "inspect": pack_dir}.get(name)
    if warm is None:
        return _stage(name, n, src, base, pack_dir, work)
    read = _warm(warm)  # before the stage's own clock starts
    return {**_stage(name, n, src, base, pack_dir, work), "warm": read}


def _stage(name: str, n: int, src: str, base: str, pack_dir: str, work: str) -> dict[str, Any]:
    import pytorchtricks as ptt

    if name == "imagefolder":
        from torchvision.datasets import ImageFolder

        ImageFolder(base)
        return _median_open(lambda: ImageFolder(src))
    if name == "jpegfolder":
        ptt.JpegFolder(base)
        return _median_open(lambda: ptt.JpegFolder(src))
    if name == "pack":
        shutil.rmtree(pack_dir, ignore_errors=True)
        _, m = _metered(lambda: ptt.pack(src, pack_dir, workers=2))
        return m | {"bytes": sum(e.stat().st_size for e in os.scandir(pack_dir))}
    if name == "open":
        ptt.ShardDataset(os.path.join(work, f"pack-{BASE_N}"))
        return _median_open(lambda: ptt.ShardDataset(pack_dir))
    if name == "loader":  # USS at the first batch, workers alive; the 2K set's own run is the baseline
        import gc

        small = ptt.ShardDataset(os.path.join(work, f"pack-{BASE_N}"), decode=None)
        warm = ptt.make_loader(small, 256, crop=32, num_workers=2, persistent_workers=False)
        next(iter(warm))
        del warm, small
        gc.collect()
        from pytorchtricks.clock import now_s

        t0 = now_s()
        ds = ptt.ShardDataset(pack_dir, decode=None)
        loader = ptt.make_loader(ds, 256, crop=32, num_workers=2)
        it = iter(loader)
        next(it)
        first = now_s() - t0
        uss = _uss()
        del it
        (_, epoch_s, imgs), m = _metered(lambda: _epoch(loader))
        return {
            "first_batch_s": first, "uss_bytes": uss, "epoch_s": epoch_s, "images_per_s": imgs / epoch_s,
            "cpu_s": m["cpu_s"], "disk_read_bytes": m["disk_read_bytes"],
        }  # fmt: skip
    if name == "cache_build":
        ds = ptt.JpegFolder(src)
        (_, epoch_s, imgs), e = _metered(lambda: _epoch(ptt.make_loader(ds, 256, crop=32, num_workers=2)))
        where = os.path.join(work, f"cache-{n}")
        shutil.rmtree(where, ignore_errors=True)
        cached, m = _metered(lambda: ptt.cache_in_ram(ds, 32, cache_dir=where, num_workers=2))
        return m | {
            "epoch_s": epoch_s, "epoch_cpu_s": e["cpu_s"], "epoch_disk_read_bytes": e["disk_read_bytes"],
            "images": imgs, "arena_bytes": int(cached.nbytes),
        }  # fmt: skip
    if name == "cache_reopen":
        where = os.path.join(work, f"cache-{n}")
        ds = ptt.JpegFolder(src)
        ptt.cache_in_ram(
            ptt.JpegFolder(base), 32, cache_dir=os.path.join(work, f"cache-{BASE_N}"), num_workers=2
        )
        return _median_open(lambda: ptt.cache_in_ram(ds, 32, cache_dir=where, num_workers=2))
    if name == "inspect":
        ptt.inspect_shards(os.path.join(work, f"pack-{BASE_N}"))
        report, m = _metered(lambda: ptt.inspect_shards(pack_dir))
        if report["problems"]:
            raise RuntimeError(f"inspect found problems: {report['problems'][:3]}")
        return m
    raise ValueError(name)


def _child(args: list[str]) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{args}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


RANK_JOB = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
import pytorchtricks as ptt
s = ptt.pack(sys.argv[1], sys.argv[2], workers=0, distributed=True)
with open(f"{sys.argv[3]}-rank{os.environ['RANK']}.json", "w") as fh:
    json.dump(s["rank_stats"], fh)
"""


def dist_pack(n: int, data: str, work: str, world: int) -> dict[str, Any]:
    """``pack --distributed`` of the N set under torchrun at ``world`` ranks on this machine."""
    from pytorchtricks.clock import time_call

    src, dst = set_dir(data, n), os.path.join(work, f"dist-{n}-w{world}")
    shutil.rmtree(dst, ignore_errors=True)
    job, log = os.path.join(work, "rank_job.py"), os.path.join(work, f"dist-{n}-w{world}-stats")
    with open(job, "w") as fh:
        fh.write(RANK_JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
           "--master-addr", "127.0.0.1", "--master-port", str(port), job, src, dst, log]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.path.join(ROOT, "src"),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    r, wall_s = time_call(lambda: subprocess.run(cmd, capture_output=True, text=True, env=env))
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    ranks = []
    for k in range(world):
        with open(f"{log}-rank{k}.json") as fh:
            ranks.append(json.load(fh))
    total = sum(x["shard_bytes"] for x in ranks)
    digest = _tree_digest(dst)
    return {
        "world": world,
        "wall_s": wall_s,
        "files_per_s_per_rank": [x["files"] / x["write_s"] for x in ranks],
        "shard_bytes_per_rank": [x["shard_bytes"] for x in ranks],
        "rank0_share": ranks[0]["shard_bytes"] / total,
        "merge_s": ranks[0]["merge_s"],
        "pack_sha256": digest,
    }


def _tree_digest(root: str) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as fh:
            h.update(name.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def _us(x: float) -> str:
    return f"{x * 1e6:.1f} us"


def _human_s(x: float) -> str:
    return f"{x / 3600:.1f} h" if x >= 3600 else f"{x / 60:.1f} min" if x >= 120 else f"{x:.1f} s"


def _slopes(vals: dict[int, float]) -> list[float]:
    return [(vals[b] - vals[a]) / (b - a) for a, b in itertools.pairwise(sorted(vals))]


def _cpu_table(by: dict[tuple[str, int], Any], sizes: list[int], seconds: Any) -> list[str]:
    """CPU-seconds per stage and size, their slopes and linearity (last slope / first), beside the wall's, and
    the disk reads at the largest size: where the wall slope grows and the CPU slope does not, the stage waited on
    the disk (its files left the page cache), not on our per-sample work."""
    if not any("cpu_s" in r["result"] for r in by.values()):
        return []
    out = [
        "",
        "## CPU-seconds (this process and its workers, `clock.CpuMeter`) and disk reads",
        "",
        (
            "Linear: the last slope within 1.3x of the first. The stages that read every sample start with their "
            "input read once (untimed), so it is in the page cache at every size; the last column is what the "
            "stage itself still read from the disk (files the kernel dropped meanwhile), beside the warm-up's."
        ),
        "",
        "| stage | " + " | ".join(f"CPU s at {n:,}" for n in sizes)
        + " | CPU slope (last two) | CPU last / first slope | wall last / first slope | disk read at "
        + f"{sizes[-1]:,} (warm-up) |",
        "|---|" + "---|" * (len(sizes) + 4),
    ]  # fmt: skip
    for stage in (*STAGES, "cache_epoch"):
        src, key, disk = ("cache_build", "epoch_cpu_s", "epoch_disk_read_bytes") if stage == "cache_epoch" else (
            stage, "cpu_s", "disk_read_bytes")  # fmt: skip
        res = {n: by[(src, n)]["result"] for n in sizes if (src, n) in by}
        cpu = {n: r[key] for n, r in res.items() if key in r}
        if len(cpu) < 2:
            continue
        wall = {n: r["epoch_s"] if stage == "cache_epoch" else seconds(src, n) for n, r in res.items()}
        cs, ws = _slopes(cpu), _slopes(wall)
        lin = f"{cs[-1] / cs[0]:.2f}" if len(cs) > 1 and cs[0] > 0 else "-"
        wlin = f"{ws[-1] / ws[0]:.2f}" if len(ws) > 1 and ws[0] > 0 else "-"
        read = res.get(sizes[-1], {}).get(disk)
        warm = (res.get(sizes[-1], {}).get("warm") or {}).get("disk_read_bytes")
        label = "one make_loader epoch over JpegFolder (crop 32)" if stage == "cache_epoch" else LABELS[stage]
        out.append(
            f"| {label} | " + " | ".join(f"{cpu[n]:.2f}" if n in cpu else "-" for n in sizes)
            + f" | {_us(cs[-1])}/sample | {lin} | {wlin} | "
            + (f"{read / 2**20:,.0f} MiB" if read is not None else "-")
            + (f" ({warm / 2**20:,.0f} MiB)" if warm is not None else "") + " |"
        )  # fmt: skip
    return out


def report(rows: list[dict[str, Any]], dist: list[dict[str, Any]], note: str, cpu: str) -> str:
    sizes = sorted({r["n"] for r in rows if r["n"] != BASE_N})
    by = {(r["stage"], r["n"]): r for r in rows}

    def seconds(stage: str, n: int) -> float | None:
        r = by.get((stage, n))
        if r is None:
            return None
        return r["result"].get("s", r["result"].get("epoch_s"))

    out = [
        f"# Ten million images: per-sample costs ({cpu})",
        "",
        f"Tiny JPEGs (80-128 x 64-96 px thumbnails of the wallpaper photos, {CLASSES} classes). {note}",
        "",
        "| stage | "
        + " | ".join(f"{n:,}" for n in sizes)
        + " | slope (last two sizes) | slope (first two) | at 10M |",
        "|---|" + "---|" * (len(sizes) + 3),
    ]
    for stage in (*STAGES, "loader_uss", "cache_epoch"):
        if stage == "loader_uss":
            base = by[("loader", BASE_N)]["result"]["uss_bytes"]
            vals = {n: by[("loader", n)]["result"]["uss_bytes"] - base for n in sizes if ("loader", n) in by}
            cells = [f"{vals[n] / 2**20:+.1f} MB" if n in vals else "-" for n in sizes]
            per = {n: vals[n] / (n - BASE_N) for n in vals}
            out.append(
                "| make_loader main-process USS growth at the first batch (vs 2K) | "
                + " | ".join(cells)
                + " | "
                + " | ".join(f"{per[n]:.1f} B/sample" for n in sorted(per)[-1:])
                + " | - | "
                + (f"{per[max(per)] * 1e7 / 2**20:.0f} MB" if per else "-")
                + " |"
            )
            continue
        if stage == "cache_epoch":
            vals = {n: by[("cache_build", n)]["result"]["epoch_s"] for n in sizes if ("cache_build", n) in by}
            label = "one make_loader epoch over JpegFolder (crop 32), for cache_build"
        else:
            vals = {n: s for n in sizes if (s := seconds(stage, n)) is not None}
            label = LABELS[stage]
        ns = sorted(vals)
        slopes = [(vals[b] - vals[a]) / (b - a) for a, b in zip(ns, ns[1:], strict=False)]
        last = slopes[-1] if slopes else (vals[ns[-1]] / ns[-1] if ns else 0.0)
        proj = vals[ns[-1]] + last * (10_000_000 - ns[-1]) if ns else 0.0
        out.append(
            f"| {label} | "
            + " | ".join(f"{vals[n]:.3f} s" if n in vals else "-" for n in sizes)
            + f" | {_us(last)}/sample | "
            + (f"{_us(slopes[0])}/sample" if len(slopes) > 1 else "-")
            + f" | {_human_s(proj)} |"
        )
    out += _cpu_table(by, sizes, seconds)
    if dist:
        out += [
            "",
            "## ptt pack --distributed (torchrun, gloo, one machine; --workers 0 per rank)",
            "",
            "| N | ranks | wall | files/s per rank | shard bytes per rank | rank 0 share | merge | pack sha256 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for d in dist:
            out.append(
                f"| {d['n']:,} | {d['world']} | {d['wall_s']:.1f} s | "
                + ", ".join(f"{x:.0f}" for x in d["files_per_s_per_rank"])
                + " | "
                + ", ".join(f"{x / 1e6:.1f} MB" for x in d["shard_bytes_per_rank"])
                + f" | {d['rank0_share']:.1%} | {d['merge_s']:.2f} s | {d['pack_sha256'][:12]} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from pytorchtricks.hardware import cpu_caps

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--dist-sizes", type=int, nargs="*", default=[20_000])
    ap.add_argument("--worlds", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--data", default="/tmp/ptt-scale/data", help="where the JPEG sets are built once")
    ap.add_argument("--work", default="/tmp/ptt-scale/work", help="packs and arenas (local disk)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class))
    ap.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stage:  # a child: one stage, one JSON line
        print(json.dumps(stage(args.stage, args.n, args.data, args.work)))
        return 0
    from pytorchtricks.clock import environment, publish

    os.makedirs(args.work, exist_ok=True)
    for n in sorted({BASE_N, *args.sizes, *args.dist_sizes}):
        make_set(args.data, n)
    where = ["--data", args.data, "--work", args.work]
    _child(["--stage", "pack", "--n", str(BASE_N), *where])
    rows = [
        {"stage": "loader", "n": BASE_N, "result": _child(["--stage", "loader", "--n", str(BASE_N), *where])}
    ]
    for n in args.sizes:
        for name in STAGES:
            res = _child(["--stage", name, "--n", str(n), *where])
            rows.append({"stage": name, "n": n, "result": res})
            print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(os.path.join(args.work, f"cache-{n}"), ignore_errors=True)
    dist = []
    for n in args.dist_sizes:
        for world in args.worlds:
            dist.append({"n": n, **dist_pack(n, args.data, args.work, world)})
            print(json.dumps(dist[-1]), flush=True)
            shutil.rmtree(os.path.join(args.work, f"dist-{n}-w{world}"), ignore_errors=True)
    env = environment()
    cpu = cpu_caps().cpu_class
    md = report(rows, dist, args.note, cpu)
    tag = "-".join(str(n // 1000) + "k" for n in args.sizes)
    all_rows = [{**r, "kind": "stage"} for r in rows] + [{**d, "kind": "dist_pack"} for d in dist]
    return publish(
        os.path.join(args.out, f"scale-{tag}"), [{**r, "env": env, "note": args.note} for r in all_rows], md
    )


if __name__ == "__main__":
    sys.exit(main())
