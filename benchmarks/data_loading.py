"""Input pipelines side by side on the same real-photo JPEGs, producing the same batches.

Every system turns the ``make data`` photos into RandomResizedCrop 224 + horizontal flip -> uint8 NCHW batches of
256 with 2 workers (threads for DALI), for 2 epochs; epoch 1 (start-up, cold caches) is reported separately from
epoch 2. Each system runs in its own child process (peers in the separate ``.venv-peers`` environment, FFCV in
``.venv-ffcv``) so peak memory is its own: the proportional set size (PSS: shared pages split between the
processes sharing them) of the child and its workers, sampled 5 times a second. Pack/convert time is measured
once, when the system's input is first built. Systems run in rotating order, round after round (interleaved), so
drift on a shared machine hits every system alike; the table reports medians over rounds.

    make bench-data                          # full size: every image of data/photos (>= 10,000)
    .venv/bin/python benchmarks/data_loading.py --images 2000 --rounds 2
    make bench-data-hires                    # the high-resolution set: >= 2 MP photos at native resolution

``--set hires`` builds (once, under ``--work``) a set of high-resolution photos instead: crops of at least
``--min-mp`` megapixels kept at the wallpapers' native resolution (``photoset.build_photo_set(min_mp=...)``), the
seed's case; there ``ptt-files`` (the region-of-interest decode: only the crop's window) runs beside
``ptt-files-nowindow`` (the same loader decoding the whole image at the DCT scale) and DALI's CPU ROI decoder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from _child import emit, run_child  # benchmarks/ is on sys.path: these run as scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, WORKERS, CROP = 256, 2, 224

# system -> (environment, description)
SYSTEMS: dict[str, tuple[str, str]] = {
    "imagefolder": ("core", "torchvision ImageFolder + PIL RandomResizedCrop (baseline)"),
    "ptt-files": (
        "core",
        "ptt make_loader on the JPEG files (region-of-interest decode of the crop, DCT-scaled)",
    ),
    "ptt-files-nowindow": (
        "core",
        "ptt make_loader on the JPEG files, whole image decoded at the DCT scale (the path before the window decode)",
    ),
    "ptt-shards": ("core", "ptt shards (ptt format) + make_loader, scaled decode"),
    "ptt-shards-noscale": ("core", "ptt shards + make_loader, scaled decode off (full decode, crop, resize)"),
    "ptt-tar": ("core", "ptt tar shards (WebDataset layout) + ShardStream + make_loader"),
    "ptt-lmdb": ("core", "ptt lmdb + make_loader"),
    "ptt-shards-resize256": ("core", "ptt shards packed with --resize 256 (short side, once) + make_loader"),
    "ptt-ram-cache": ("core", "ptt cache_in_ram (decoded, short side 256, /dev/shm arena) + make_loader"),
    "webdataset": ("peers", "WebDataset tar (wds.ShardWriter) + PIL + torchvision transforms"),
    "litdata": ("peers", "LitData optimize + StreamingDataset/StreamingDataLoader + PIL + torchvision"),
    "dali-cpu": ("peers", "DALI CPU pipeline (device_id=None): file reader, image_random_crop, resize, flip"),
    "ffcv": (
        "ffcv",
        "FFCV .beton (RGBImageField write_mode='jpg', the files' JPEG bytes stored as they are, no max_resolution) "
        "+ Loader (RANDOM order, os_cache, drop_last): RandomResizedCropRGBImageDecoder, flip, "
        "ToTorchImage(channels_last=False); epoch 1 includes numba compiling the pipeline",
    ),
}


def _now() -> float:
    from pytorchtricks.clock import now_s

    return now_s()


# ------------------------------------------------------------------------------------------------ memory


class PssSampler:
    """Peak PSS of this process and its children, sampled in a thread every 0.2 s (a pause, not a clock read)."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except (psutil.Error, AttributeError):
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_bytes = max(self.peak_bytes, self._sample())

    def __enter__(self) -> PssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------------------------------------ inputs


def subset_folder(src: str, n: int, work: str) -> str:
    """A folder of symlinks to the first ``n`` photos, classes kept in proportion; every system reads it."""
    dst = os.path.join(work, f"photos-{n}")
    if os.path.exists(os.path.join(dst, ".done")):
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    files = [(c, f) for c in classes for f in sorted(os.listdir(os.path.join(src, c))) if f.endswith(".jpg")]
    if len(files) < n:
        raise SystemExit(f"{src} holds {len(files)} photos, fewer than --images {n}; run `make data` first.")
    step = len(files) / n
    for k in range(n):
        c, f = files[int(k * step)]
        os.makedirs(os.path.join(dst, c), exist_ok=True)
        os.symlink(os.path.join(os.path.abspath(src), c, f), os.path.join(dst, c, f))
    open(os.path.join(dst, ".done"), "w").close()
    return dst


def _timed_build(marker: str, build: Callable[[], Any]) -> float | None:
    """Run ``build`` once (if ``marker`` is missing) and remember its seconds in the marker; None if reused."""
    if os.path.exists(marker):
        with open(marker) as fh:
            return float(json.load(fh)["convert_s"])
    t0 = _now()
    build()
    seconds = _now() - t0
    with open(marker, "w") as fh:
        json.dump({"convert_s": seconds}, fh)
    return seconds


# ------------------------------------------------------------------------------------------------ systems


def _tv_transform() -> Any:
    from torchvision import transforms as T

    return T.Compose([T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(), T.PILToTensor()])


def sys_imagefolder(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    import torch
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(folder, transform=_tv_transform())
    dl = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, persistent_workers=True
    )
    return dl, 0.0


def _ptt_pack(folder: str, work: str, name: str, **kw: Any) -> tuple[str, float | None]:
    from pytorchtricks.shards.writer import pack

    dst = os.path.join(work, name)

    def build() -> None:
        shutil.rmtree(dst, ignore_errors=True)
        pack(folder, dst, workers=WORKERS, **kw)

    return dst, _timed_build(dst + ".convert.json", build)


def _ptt_loader(ds: Any, **kw: Any) -> Any:
    import pytorchtricks as ptt

    return ptt.make_loader(ds, BATCH, crop=CROP, num_workers=WORKERS, drop_last=False, **kw)


def sys_ptt_files(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    import pytorchtricks as ptt

    return _ptt_loader(ptt.JpegFolder(folder)), 0.0


def sys_ptt_files_nowindow(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    import pytorchtricks as ptt
    from pytorchtricks.data.decode import fallback_backend

    return _ptt_loader(ptt.JpegFolder(folder), backend=fallback_backend()), 0.0


def sys_ptt_shards(folder: str, work: str, scaled: bool = True) -> tuple[Iterable[Any], float | None]:
    from pytorchtricks.shards.dataset import ShardDataset

    dst, conv = _ptt_pack(folder, work, "pack-ptt", format="ptt")
    return _ptt_loader(ShardDataset(dst, decode=None), scaled_decode=scaled), conv


def sys_ptt_tar(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    from pytorchtricks.shards.stream import ShardStream

    dst, conv = _ptt_pack(folder, work, "pack-tar", format="tar")
    return _ptt_loader(ShardStream(dst, shuffle=True, seed=0, decode=None)), conv


def sys_ptt_lmdb(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    from pytorchtricks.shards.dataset import ShardDataset

    dst, conv = _ptt_pack(folder, work, "pack-lmdb", format="lmdb")
    return _ptt_loader(ShardDataset(dst, decode=None)), conv


def sys_ptt_resize(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    from pytorchtricks.shards.dataset import ShardDataset

    dst, conv = _ptt_pack(folder, work, "pack-ptt-r256", format="ptt", resize=256)
    return _ptt_loader(ShardDataset(dst, decode=None)), conv


def sys_ptt_cache(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    import pytorchtricks as ptt

    cache_dir = "/dev/shm/ptt-bench-cache"
    marker = os.path.join(work, f"ram-cache-{os.path.basename(folder)}.convert.json")
    if not os.path.exists(cache_dir) and os.path.exists(marker):
        os.remove(marker)  # the arena lives in RAM: gone after a reboot
    holder: dict[str, Any] = {}

    def build() -> None:
        holder["ds"] = ptt.cache_in_ram(
            ptt.JpegFolder(folder), 256, cache_dir=cache_dir, num_workers=WORKERS, strict=True
        )

    conv = _timed_build(marker, build)
    ds = holder.get("ds") or ptt.cache_in_ram(ptt.JpegFolder(folder), 256, cache_dir=cache_dir, strict=True)
    return _ptt_loader(ds), conv


def sys_webdataset(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    import webdataset as wds

    dst = os.path.join(work, "wds")
    from torchvision.datasets import ImageFolder

    def build() -> None:
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        samples = ImageFolder(folder).samples
        import random

        random.Random(0).shuffle(samples)
        with wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"), maxcount=1000, verbose=0) as sink:
            for k, (path, label) in enumerate(samples):
                with open(path, "rb") as fh:
                    sink.write({"__key__": f"{k:08d}", "jpg": fh.read(), "cls": label})

    conv = _timed_build(dst + ".convert.json", build)
    shards = sorted(os.path.join(dst, f) for f in os.listdir(dst) if f.endswith(".tar"))
    tf = _tv_transform()
    ds = (
        wds.WebDataset(shards, shardshuffle=len(shards), nodesplitter=wds.split_by_node, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(tf, lambda x: x)
        .batched(BATCH, partial=True)
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=WORKERS, persistent_workers=True), conv


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    with open(path, "rb") as fh:
        return {"jpg": fh.read(), "cls": label}


def sys_litdata(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    import litdata as ld
    from torchvision.datasets import ImageFolder

    dst = os.path.join(work, "litdata")

    def build() -> None:
        shutil.rmtree(dst, ignore_errors=True)
        ld.optimize(
            fn=_litdata_item,
            inputs=ImageFolder(folder).samples,
            output_dir=dst,
            chunk_bytes="64MB",
            num_workers=WORKERS,
        )

    conv = _timed_build(dst + ".convert.json", build)
    return ld.StreamingDataLoader(_litdata_dataset(dst), batch_size=BATCH, num_workers=WORKERS), conv


def _litdata_dataset(path: str) -> Any:
    import io

    import litdata as ld
    from PIL import Image

    class LitPhotos(ld.StreamingDataset):  # type: ignore[misc]
        tf = _tv_transform()

        def __getitem__(self, index: Any) -> Any:
            item = super().__getitem__(index)
            return self.tf(Image.open(io.BytesIO(item["jpg"])).convert("RGB")), item["cls"]

    globals()["LitPhotos"] = LitPhotos  # picklable by name for the DataLoader workers
    LitPhotos.__qualname__ = "LitPhotos"
    return LitPhotos(path, shuffle=True, seed=0)


def sys_dali(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    from nvidia.dali import fn, pipeline_def, types

    n = sum(len(fs) for _, _, fs in os.walk(folder) if fs) - 1  # minus the .done marker

    @pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=None, seed=0)
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(
            file_root=folder, random_shuffle=True, pad_last_batch=True, name="reader"
        )
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=CROP, resize_y=CROP)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return fn.transpose(images, perm=[2, 0, 1]), labels

    p = pipe()
    p.build()

    class Epoch:
        def __iter__(self) -> Any:
            import numpy as np
            import torch

            for b in range(-(-n // BATCH)):
                images, labels = p.run()
                keep = min(BATCH, n - b * BATCH)  # the last batch is padded by the reader: count real images
                yield torch.from_numpy(np.asarray(images.as_tensor())[:keep]), labels  # one dense buffer

    return Epoch(), 0.0


class _JpegFiles:
    """(JPEG file bytes, class index) per ImageFolder sample, read lazily: the dataset FFCV's writer converts."""

    def __init__(self, folder: str) -> None:
        from torchvision.datasets import ImageFolder

        self.samples = ImageFolder(folder).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, k: int) -> tuple[bytes, int]:
        path, label = self.samples[k]
        with open(path, "rb") as fh:
            return fh.read(), label


def _ffcv_keep_jpeg(destination: Any, data: bytes, malloc: Any) -> None:
    """RGBImageField.encode that stores a file's JPEG bytes as they are (FFCV's own decodes and re-encodes at
    quality 90); the header gives width and height, decoding stays FFCV's (mode 'jpg', libjpeg-turbo)."""
    import io

    import numpy as np
    from ffcv.fields.rgb_image import IMAGE_MODES
    from PIL import Image

    destination["mode"] = IMAGE_MODES["jpg"]
    destination["width"], destination["height"] = Image.open(io.BytesIO(data)).size
    destination["data_ptr"], storage = malloc(len(data))
    storage[:] = np.frombuffer(data, dtype=np.uint8)


def sys_ffcv(folder: str, work: str) -> tuple[Iterable[Any], float | None]:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter

    dst = os.path.join(work, f"ffcv-{os.path.basename(folder)}.beton")

    def build() -> None:
        if os.path.exists(dst):
            os.remove(dst)
        image = RGBImageField(write_mode="jpg")  # max_resolution unset: every photo at its own size
        image.encode = _ffcv_keep_jpeg  # on the instance: the .beton header names a field by its exact class
        writer = DatasetWriter(dst, {"image": image, "label": IntField()}, num_workers=WORKERS)
        writer.from_indexed_dataset(_JpegFiles(folder))

    conv = _timed_build(dst + ".convert.json", build)
    pipelines = {
        "image": [
            RandomResizedCropRGBImageDecoder((CROP, CROP)),
            RandomHorizontalFlip(),
            ToTensor(),
            ToTorchImage(channels_last=False),  # dense NCHW like every other system (True: an NHWC view)
        ],
        "label": [IntDecoder(), ToTensor()],
    }
    loader = Loader(
        dst,
        batch_size=BATCH,
        num_workers=WORKERS,
        order=OrderOption.RANDOM,
        drop_last=True,
        os_cache=True,
        pipelines=pipelines,
    )
    return loader, conv


RUNNERS: dict[str, Callable[[str, str], tuple[Iterable[Any], float | None]]] = {
    "imagefolder": sys_imagefolder,
    "ptt-files": sys_ptt_files,
    "ptt-files-nowindow": sys_ptt_files_nowindow,
    "ptt-shards": sys_ptt_shards,
    "ptt-shards-noscale": lambda f, w: sys_ptt_shards(f, w, scaled=False),
    "ptt-tar": sys_ptt_tar,
    "ptt-lmdb": sys_ptt_lmdb,
    "ptt-shards-resize256": sys_ptt_resize,
    "ptt-ram-cache": sys_ptt_cache,
    "webdataset": sys_webdataset,
    "litdata": sys_litdata,
    "dali-cpu": sys_dali,
    "ffcv": sys_ffcv,
}


def run_one(system: str, folder: str, work: str, epochs: int) -> dict[str, Any]:
    """Child process: build the input (timed once), then time each epoch; print one JSON line."""
    import torch

    torch.set_num_threads(1)
    with PssSampler() as mem:
        loader, convert_s = RUNNERS[system](folder, work)
        times, counts, shape = [], [], None
        for _ in range(epochs):
            t0 = _now()
            n = 0
            for batch in loader:
                x = batch[0]
                n += int(x.shape[0])
                shape = shape or [list(x.shape), str(x.dtype)]
            times.append(_now() - t0)
            counts.append(n)
    if epochs == 0:
        return {"system": system, "convert_s": convert_s, "prepared": True}
    return {
        "system": system,
        "epoch_s": times,
        "images": counts,
        "images_per_s": [c / t for c, t in zip(counts, times)],
        "convert_s": convert_s,
        "peak_pss_bytes": mem.peak_bytes,
        "batch": shape,
    }


# ------------------------------------------------------------------------------------------------ parent


def _python_for(env: str, pythons: dict[str, str]) -> str | None:
    """The interpreter of a system's environment; None if that environment is not built."""
    if env == "core":
        return sys.executable
    return pythons[env] if os.path.exists(pythons[env]) else None


def _markdown(
    rows: list[dict[str, Any]], n: int, rounds: int, env: dict[str, Any], notes: list[str], kind: str = ""
) -> str:
    by: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    for r in rows:
        if "images_per_s" in r:
            by.setdefault(r["system"], []).append(r)
        elif "error" in r:
            errors[r["system"]] = r["error"]
    med = {
        s: [
            statistics.median(r["images_per_s"][e] for r in rs)
            for e in range(min(len(r["images_per_s"]) for r in rs))
        ]
        for s, rs in by.items()
        if "images_per_s" in rs[0]
    }
    base = med.get("imagefolder")
    out = [
        f"# Data loading: {n} real-photo JPEGs{kind} -> RandomResizedCrop {CROP} + flip -> uint8 NCHW, batch {BATCH}, "
        f"{WORKERS} workers",
        "",
        f"{env.get('cpu')} ({env.get('cpu_count')} cores), torch {env.get('torch')}, {env.get('time_utc')}, "
        f"git {env.get('git_sha')}. Medians over {rounds} interleaved round(s); ratio = images/s over ImageFolder's "
        "in the same epoch."
        + (
            f" Load average at the start: {env['loadavg_1m_at_start']}."
            if env.get("loadavg_1m_at_start") is not None
            else ""
        ),
        "",
        "| system | epoch 1 img/s | epoch 2 img/s | x ImageFolder (ep1 / ep2) | pack/convert s | peak PSS MiB "
        "| rounds | batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in SYSTEMS:
        rs = by.get(s)
        if not rs:
            if s in errors:
                out.append(f"| {s} | - | - | - | - | - | 0 | not run: {errors[s]} |")
            continue
        m = med[s]
        ratio = " / ".join(f"{v / b:.2f}" for v, b in zip(m, base)) if base and all(base) else "-"
        conv = rs[0].get("convert_s")
        peak = statistics.median(r["peak_pss_bytes"] for r in rs) / 2**20
        out.append(
            f"| {s} | {m[0]:.0f} | {m[-1]:.0f} | {ratio} | {'-' if conv is None else f'{conv:.1f}'} | "
            f"{peak:.0f} | {len(rs)} | {rs[0]['batch'][0]} {rs[0]['batch'][1].replace('torch.', '')} |"
        )
    out += ["", "Systems:", ""] + [f"- `{s}`: {d}" for s, (_, d) in SYSTEMS.items() if s in by or s in errors]
    if notes:
        out += ["", "Notes:", ""] + [f"- {x}" for x in notes]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    global BATCH
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src", default=None, help="the photos (default: data/photos; --set hires: built under --work)"
    )
    ap.add_argument("--set", default="photos", choices=("photos", "hires"), help="hires: >= --min-mp photos")
    ap.add_argument("--min-mp", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--work", default="/tmp/ptt-bench-data")
    from pytorchtricks.hardware import cpu_caps  # results are filed by CPU class

    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class))
    ap.add_argument("--peers-python", default=os.path.join(ROOT, ".venv-peers", "bin", "python"))
    ap.add_argument("--ffcv-python", default=os.path.join(ROOT, ".venv-ffcv", "bin", "python"))
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--note", action="append", default=[], help="a line for the Markdown notes")
    ap.add_argument("--append", action="store_true", help="add rounds to this size's existing results")
    ap.add_argument(
        "--render-only", action="store_true", help="rewrite the .md from the .jsonl, time nothing"
    )
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    BATCH = args.batch  # the children get the same --batch
    if args.run_one:
        emit(run_one(args.run_one, args.folder, args.work, args.epochs))
        return 0

    from pytorchtricks.clock import environment, write_jsonl

    if args.render_only:  # rewrite the Markdown from the committed JSONL (e.g. with a --note), no timing
        stem = f"data_loading-{args.images}" if args.set == "photos" else f"data_loading-hires-{args.images}"
        with open(os.path.join(args.out, f"{stem}.jsonl")) as fh:
            done = [json.loads(line) for line in fh if line.strip()]
        kind = "" if args.set == "photos" else f" (>= {args.min_mp:g} MP, native resolution)"
        md = _markdown(done, args.images, len({r["round"] for r in done}), done[0]["env"], args.note, kind)
        with open(os.path.join(args.out, f"{stem}.md"), "w") as fh:
            fh.write(md)
        print(md)
        return 0

    tag = f"data_loading-{args.images}" if args.set == "photos" else f"data_loading-hires-{args.images}"
    if args.src is None and args.set == "hires":
        from pytorchtricks.data.photoset import build_photo_set

        args.src = os.path.join(args.work, f"hires-{args.min_mp:g}mp-{args.images}")
        build_photo_set(args.src, args.images, min_mp=args.min_mp, workers=WORKERS)
    src = args.src or os.path.join(ROOT, "data", "photos")
    # packs of different sizes (and sets) never share a folder
    args.work = os.path.join(
        args.work, f"n{args.images}" if args.set == "photos" else f"hires-n{args.images}"
    )
    os.makedirs(args.work, exist_ok=True)
    folder = subset_folder(src, args.images, args.work)
    systems = [s for s in args.systems.split(",") if s]
    env = environment()
    env["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    jsonl = os.path.join(args.out, f"{tag}.jsonl")
    old: list[dict[str, Any]] = []
    if args.append and os.path.exists(jsonl):
        with open(jsonl) as fh:
            old = [json.loads(line) for line in fh if line.strip()]
    first = 1 + max((int(r["round"]) for r in old), default=-1)

    def child(s: str, epochs: int) -> dict[str, Any]:
        env_name = SYSTEMS[s][0]
        py = _python_for(env_name, {"peers": args.peers_python, "ffcv": args.ffcv_python})
        if py is None:
            return {"error": f"{env_name} environment missing (make {env_name}-env)"}
        cmd = [py, os.path.abspath(__file__), "--run-one", s, "--folder", folder, "--work", args.work]
        cmd += ["--batch", str(BATCH)]
        return run_child([*cmd, "--epochs", str(epochs)], args.timeout_s, ROOT, error_chars=200)

    prepared = {s: child(s, 0) for s in systems}  # pack/convert once, in its own process, before any timing
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        for s in order:
            row: dict[str, Any] = {"system": s, "round": first + r, "images_requested": args.images}
            row.update(prepared[s] if "error" in prepared[s] else child(s, args.epochs))
            print(json.dumps(row), flush=True)
            rows.append(row)
    if os.path.exists(jsonl):
        os.remove(jsonl)  # one file per size; with --append the old rows are written back first
    write_jsonl(jsonl, old + [{**row, "env": env, "rounds": args.rounds} for row in rows])
    rounds = len({r["round"] for r in old} | {r["round"] for r in rows})
    kind = "" if args.set == "photos" else f" (>= {args.min_mp:g} MP, native resolution)"
    md = _markdown(old + rows, args.images, rounds, env, args.note, kind)
    with open(os.path.join(args.out, f"{tag}.md"), "w") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
