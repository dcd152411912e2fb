"""What one child process of the Ultralytics benchmark measures (one system, one setting), returned as a row.

- ``load``: the load stage, bytes to an image at imgsz (Ultralytics' ``load_image``), one thread, each photo once;
  the pack's PSNR against the stock load of the same photo.
- ``pipeline``: the whole data pipeline, images/s through Ultralytics' dataset and loader (mosaic on, its own
  augmentations, ``workers`` processes), one epoch after the first batch; then, in the same process and without
  workers, where a sample's time goes (load, mosaic, affine, HSV, ...).
- ``first-batch``: from nothing to the first batch on a 100K-image root (dataset build: listing + label scan or
  labels cache or the pack's index, loader, first batch).
- ``epoch``: the training epoch's wall time on CPU through Ultralytics' own trainer (``model.train``), callbacks
  on its epoch start/end; or ``--device-step-ms``: the projection ``ptt tune`` makes for a declared accelerator step
  (each batch its loader gives is held that long by a stand-in step that uses no core).
- ``ram``: cache='ram' under torchrun with 2 ranks: USS of every rank and loader worker (psutil), summed.

Only ``pytorchtricks.clock`` reads a clock.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import _ultralytics_systems as us  # benchmarks/ is on sys.path: these run as scripts


def _psnr(a: Any, b: Any) -> float:
    """PSNR of ``a`` against ``b`` (dB); ``a`` resized to ``b``'s shape first where a rounding of the pack's
    stored size made it differ by a pixel."""
    import cv2
    import numpy as np

    if a.shape != b.shape:
        a = cv2.resize(a, (b.shape[1], b.shape[0]), interpolation=cv2.INTER_LINEAR).reshape(b.shape)
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(255.0**2 / mse))


def load(spec: dict[str, Any]) -> dict[str, Any]:
    """Each photo's ``load_image`` once, cold (nothing in Ultralytics' buffer), one thread."""
    import torch

    from pytorchtricks.clock import now_s

    torch.set_num_threads(1)
    ds = us.dataset(spec["system"], spec["yaml"], spec["imgsz"], None, 16, spec.get("pack"), augment=False)
    from PIL import Image

    stock = us.dataset("stock", spec["yaml"], spec["imgsz"], None, 16, None, augment=False)
    ref = (
        None if spec["system"] == "stock" else stock
    )  # its load of the same photo, untimed: the PSNR reference
    idx = list(range(min(len(ds), spec["n"])))
    # rect (val) datasets sort their images by aspect ratio, each by its own sizes (a pack's round differently):
    # position i of the stock dataset is the photo at position at[i] of this one
    listing = sorted(os.path.basename(f) for f in stock.im_files)
    key = {os.path.basename(f): listing.index(os.path.basename(f)) for f in stock.im_files}
    here = {
        (
            int(os.path.splitext(os.path.basename(f))[0])
            if spec["system"] == "ptt-pack"
            else key[os.path.basename(f)]
        ): j
        for j, f in enumerate(ds.im_files)
    }
    at = [here[key[os.path.basename(stock.im_files[i])]] for i in range(len(stock))]
    mp, prog = [], []  # the original photo's size (a pack stores it shrunk) and coding, from its header
    for i in idx:
        with Image.open(stock.im_files[i]) as im:
            mp.append(im.size[0] * im.size[1] / 1e6)
            prog.append(bool(im.info.get("progressive") or im.info.get("progression")))
    mismatched = 0
    for i in idx[:2]:  # warm-up: libraries loaded, decoder initialised
        ds.load_image(at[i])
    ms, psnr = [], []
    for i in idx:
        ds.ims[at[i]] = None  # cold: never Ultralytics' buffer
        t0 = now_s()
        im = ds.load_image(at[i])[0]
        ms.append((now_s() - t0) * 1e3)
        if ref is not None:
            want = ref.load_image(i)[0]
            mismatched += im.shape != want.shape
            psnr.append(_psnr(im, want))
    big = [t for t, m in zip(ms, mp, strict=True) if m >= 8.0]
    big_p = [t for t, m, p in zip(ms, mp, prog, strict=True) if m >= 8.0 and p]
    big_b = [t for t, m, p in zip(ms, mp, prog, strict=True) if m >= 8.0 and not p]
    good = [p for p in psnr if p != float("inf")]
    return {
        "images": len(ms),
        "images_8mp": len(big),
        "ms_per_image": statistics.median(ms),
        "images_per_s": len(ms) / (sum(ms) / 1e3),
        "images_per_s_8mp": len(big) / (sum(big) / 1e3) if big else None,
        "images_8mp_progressive": len(big_p),
        "images_per_s_8mp_progressive": len(big_p) / (sum(big_p) / 1e3) if big_p else None,
        "images_per_s_8mp_baseline": len(big_b) / (sum(big_b) / 1e3) if big_b else None,
        "ms_per_image_each": ms,
        "psnr_db_median": statistics.median(good) if good else None,
        "psnr_db_min": min(good) if good else None,
        "psnr_shape_resized": mismatched,
        "megapixels": [min(mp), max(mp)],
    }


class _Stages:
    """Exclusive seconds per augmentation stage: a stage that loads images (mosaic) does not count their load."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.load_s = 0.0
        self.loads = 0

    def wrap_load(self, ds: Any) -> None:
        from pytorchtricks.clock import now_s

        inner = ds.load_image

        def timed(*a: Any, **k: Any) -> Any:
            t0 = now_s()
            try:
                return inner(*a, **k)
            finally:
                self.load_s += now_s() - t0
                self.loads += 1

        ds.load_image = timed

    def wrap(self, compose: Any) -> None:
        """Every transform of Ultralytics' ``Compose`` (nested ones too) timed under its class name."""
        for k, t in enumerate(compose.transforms):
            if hasattr(t, "transforms") and isinstance(t.transforms, list):
                self.wrap(t)
            else:
                compose.transforms[k] = _Timed(t, self)


class _Timed:
    def __init__(self, t: Any, stages: _Stages) -> None:
        self.t, self.stages, self.name = t, stages, type(t).__name__

    def __getattr__(self, name: str) -> Any:
        return getattr(self.t, name)

    def __call__(self, *a: Any, **k: Any) -> Any:
        from pytorchtricks.clock import now_s

        load0, t0 = self.stages.load_s, now_s()
        out = self.t(*a, **k)
        own = now_s() - t0 - (self.stages.load_s - load0)
        self.stages.s[self.name] = self.stages.s.get(self.name, 0.0) + own
        return out


def pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    """Images/s through the system's dataset and Ultralytics' loader, then the stage split without workers."""
    import torch

    from pytorchtricks.clock import now_s

    torch.set_num_threads(1)
    sys_, yaml, imgsz, cache = spec["system"], spec["yaml"], spec["imgsz"], spec.get("cache")
    t0 = now_s()
    ds = us.dataset(sys_, yaml, imgsz, cache, spec["batch"], spec.get("pack"))
    build_s = now_s() - t0
    dl = us.loader(ds, spec["batch"], spec["workers"])
    it = iter(dl)
    next(it)  # workers started, first batch: not counted
    t0, n = now_s(), 0
    for _ in range(len(dl) - 1):
        n += int(next(it)["img"].shape[0])
    loader_s = now_s() - t0
    if hasattr(dl, "close"):
        dl.close()
    del it, dl
    out = {"build_s": build_s, "images": n, "loader_s": loader_s, "images_per_s": n / loader_s}
    if not spec["split_n"]:
        return out
    # the split: a fresh dataset in this process (no workers), each transform timed exclusive of the loads it does
    ds = us.dataset(sys_, yaml, imgsz, cache, spec["batch"], spec.get("pack"))
    st = _Stages()
    st.wrap_load(ds)
    st.wrap(ds.transforms)
    m = min(len(ds), spec["split_n"])
    t0 = now_s()
    for i in range(m):
        ds[i]
    total = now_s() - t0
    split = {"load": st.load_s, **st.s}
    split["other"] = max(0.0, total - sum(split.values()))
    return {
        **out,
        "split_images": m,
        "split_loads_per_image": st.loads / m,
        "split_ms_per_image": {k: v / m * 1e3 for k, v in split.items()},
    }


def first_batch(spec: dict[str, Any]) -> dict[str, Any]:
    """From nothing to the first batch: dataset (listing, labels: scan, cache or index), loader, one batch."""
    import torch

    from pytorchtricks.clock import now_s

    torch.set_num_threads(1)
    import shutil

    cache_file = os.path.join(os.path.dirname(spec["yaml"]), "labels", "train.cache")
    if spec.get("labels_cache") is False and os.path.exists(cache_file):
        os.remove(cache_file)  # the first run: Ultralytics scans every label and image header
    pack = spec.get("pack")
    if spec["system"] == "ptt-pack" and spec.get("labels_cache") is False and pack:
        for name in os.listdir(pack):  # the pack's first open: its files out of the page cache (read cold)
            fd = os.open(os.path.join(pack, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    shutil.rmtree(os.path.join(os.environ["PTT_CACHE_DIR"], "ultralytics", "labels"), ignore_errors=True)
    # the trainer (its imports, seeds, model for the stride: the same few seconds on both sides) before the clock
    trainer, img_path = us.trainer(
        spec["system"], spec["yaml"], spec["imgsz"], None, spec["batch"], spec.get("pack")
    )
    t0 = now_s()
    ds = trainer.build_dataset(img_path, mode="train", batch=spec["batch"])
    built = now_s() - t0
    dl = us.loader(ds, spec["batch"], spec["workers"])
    batch = next(iter(dl))
    total = now_s() - t0
    return {
        "images": len(ds),
        "dataset_s": built,
        "first_batch_s": total,
        "batch": int(batch["img"].shape[0]),
        "labels_cache_existed": spec.get("labels_cache") is not False,
        "labels_cache_written": os.path.exists(cache_file),
        "pack_files_evicted": spec["system"] == "ptt-pack" and spec.get("labels_cache") is False,
    }


class _EpochDone(Exception):
    """Raised by the epoch-end callback: the measured epoch is over."""


def epoch_trainer(spec: dict[str, Any]) -> dict[str, Any]:
    """One CPU training epoch through Ultralytics' own trainer (yolov8n from its YAML, no weights): the wall time
    between its epoch-start and epoch-end callbacks, validation off."""
    us.quiet()
    from ultralytics import YOLO

    from pytorchtricks.clock import now_s

    model = YOLO("yolov8n.yaml")
    marks: dict[str, float] = {}
    model.add_callback("on_train_epoch_start", lambda tr: marks.setdefault("start", now_s()))

    def end(tr: Any) -> None:
        marks.setdefault("end", now_s())
        raise _EpochDone  # the epoch is measured: skip its final validation and saving

    model.add_callback("on_train_epoch_end", end)
    data = spec["yaml"]
    if (
        spec["system"] != "stock"
    ):  # the same workers as the stock trainer (it sets 0 on CPU; so does the rule here)
        match = "speed" if spec["system"] == "ptt-files-speed" else "stock"
        us.integration().accelerate(model, workers=0, match=match)
    if spec["system"] == "ptt-pack":
        data = spec["pack"].rstrip("/") + ".yaml"  # train: and val: the pack (written by --prepare)
    try:
        model.train(
            data=data, imgsz=spec["imgsz"], epochs=1, batch=spec["batch"], workers=spec["workers"],
            device="cpu", val=False, plots=False, save=False, close_mosaic=0, amp=False, exist_ok=True,
            project="/tmp/ptt-ultra/runs", name=f"{spec['system']}-{spec['imgsz']}", verbose=False,
        )  # fmt: skip
    except _EpochDone:
        pass
    n = len(model.trainer.train_loader.dataset)
    return {
        "images": n,
        "epoch_s": marks["end"] - marks["start"],
        "images_per_s": n / (marks["end"] - marks["start"]),
    }


def epoch_declared(spec: dict[str, Any]) -> dict[str, Any]:
    """The epoch beside a declared accelerator step (``ptt tune --device-step-ms``'s projection): the system's
    training loader (``workers`` processes) feeds a stand-in step that holds this process ``device_step_ms`` per
    batch without using a core; the wall time of the epoch's batches after its first (the workers' start-up is
    not an epoch's: Ultralytics' loader keeps its workers)."""
    import torch

    from pytorchtricks.clock import hold_s, now_s

    torch.set_num_threads(1)
    ds = us.dataset(spec["system"], spec["yaml"], spec["imgsz"], None, spec["batch"], spec.get("pack"))
    dl = us.loader(ds, spec["batch"], spec["workers"])
    step_s = spec["device_step_ms"] / 1e3
    it = iter(dl)
    next(it)  # workers started (Ultralytics' loader keeps them across epochs): the steady epoch follows
    hold_s(step_s)
    t0, n, waits = now_s(), 0, 0.0
    for _ in range(len(dl) - 1):
        w0 = now_s()
        n += int(next(it)["img"].shape[0])
        waits += now_s() - w0
        hold_s(step_s)
    total = now_s() - t0
    floor = (len(dl) - 1) * step_s
    return {
        "images": n,
        "batches": len(dl) - 1,
        "epoch_s": total,
        "device_only_s": floor,
        "data_wait_share": waits / total,
        "images_per_s": n / total,
    }


def _memory(pid: int) -> dict[str, int]:
    """USS and PSS of a process and each of its children (loader workers), in bytes."""
    import psutil

    out = {"uss": 0, "pss": 0, "procs": 0}
    me = psutil.Process(pid)
    for p in [me, *me.children(recursive=True)]:
        try:
            m = p.memory_full_info()
        except psutil.Error:
            continue
        out["uss"] += int(m.uss)
        out["pss"] += int(m.pss)
        out["procs"] += 1
    return out


def _cache_of(ds: Any) -> dict[str, Any]:
    """What holds the dataset's cache='ram' images: Ultralytics' per-process buffer, or ptt's node arena."""
    cached = getattr(ds.ims, "cached", None)
    if cached is not None:
        return {"cache": "ptt arena", "cache_bytes": int(cached.nbytes), "arena": str(cached.path)}
    offsets = getattr(ds.ims, "offsets", None)
    if offsets is not None:
        return {"cache": "Ultralytics _ImageCache (per rank)", "cache_bytes": int(offsets[-1])}
    return {"cache": "none (refused)", "cache_bytes": 0}


def ram_rank(spec: dict[str, Any]) -> dict[str, Any] | None:
    """One torchrun rank: cache='ram' dataset, Ultralytics' loader (``workers``), a few batches, then the USS and
    PSS of this rank and its workers; rank 0 returns every rank's (the others return None)."""
    import shutil

    import torch
    import torch.distributed as dist

    from pytorchtricks.clock import now_s

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    shm0 = shutil.disk_usage("/dev/shm").used
    before = set(os.listdir("/dev/shm/ptt-cache")) if os.path.isdir("/dev/shm/ptt-cache") else set()
    t0 = now_s()
    ds = us.dataset(spec["system"], spec["yaml"], spec["imgsz"], "ram", spec["batch"], spec.get("pack"))
    build_s = now_s() - t0
    dl = us.loader(ds, spec["batch"], spec["workers"])
    it = iter(dl)
    for _ in range(spec["batches"]):
        next(it)
    dist.barrier()  # every rank built and its workers running: measure all at once
    mine = {"rank": rank, "build_s": build_s, **_memory(os.getpid()), **_cache_of(ds)}
    mine["shm_used_delta"] = shutil.disk_usage("/dev/shm").used - shm0
    if "arena" in mine:
        mine["arena_existed"] = os.path.basename(mine["arena"]) in before
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, mine)
    dist.barrier()
    del it
    if hasattr(dl, "close"):
        dl.close()
    dist.destroy_process_group()
    if rank:
        return None
    return {
        "ranks": rows,
        "uss_sum_bytes": sum(r["uss"] for r in rows),
        "pss_sum_bytes": sum(r["pss"] for r in rows),
        "processes": sum(r["procs"] for r in rows),
        "shm_used_delta_bytes": max(r["shm_used_delta"] for r in rows),
        "cache": rows[0]["cache"],
        "cache_bytes_per_rank": [r["cache_bytes"] for r in rows],
        "arenas": sorted({r["arena"] for r in rows if "arena" in r}),
        "images": len(ds),
    }
