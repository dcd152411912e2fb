"""Detection input pipelines side by side on 2-24 MP photos with boxes, producing the same training input.

The photos are the high-resolution set (crops of >= 2 MP at the wallpapers' native resolution, as a camera delivers
them; ``photoset.build_photo_set(min_mp=2)``), each given 1-8 boxes by a seeded generator and written as a COCO root
(``annotations/instances_train.json`` over the photo folder). Recipes: ``shortest`` (short side 800, max 1333,
flip: Faster R-CNN's) and ``lsj`` (scale jitter to 1024 + 1024 crop/pad + flip). Systems:

- ``tv-hflip``: torchvision's detection reference as users run it: ``CocoDetection`` +
  ``wrap_dataset_for_transforms_v2`` + the "hflip" policy (flip, PILToTensor, ToDtype float, sanitize), list
  collate; the model's ``GeneralizedRCNNTransform`` then resizes on the device (not timed here: it is the model's).
- ``tv-shortest``: the same with ``RandomShortestSize(800, 1333)`` in the loader, so its images match ours.
- ``tv-lsj``: ``ScaleJitter(1024)`` + ``RandomCrop(1024, pad_if_needed)`` (the references' FixedSizeCrop) + flip.
- ``ptt`` / ``ptt-lsj``: ``ptt.make_detection_loader`` (uint8, padded batches, boxes followed).
- ``dali-cpu``: DALI's CPU pipeline (``device_id=None``): COCO reader, decoder, ``bb_flip`` + flip, resize
  (shorter 800, max 1333), pad to a multiple of 32.
- ``floor`` / ``floor-lsj``: the decode floor - each photo decoded whole at the DCT scale its output needs
  (``data.decode.decode_scaled``: to RGB), nothing else, in the same 2 workers.
- ``floor-planes``: the same decode to the JPEG's Y/Cb/Cr planes (``data.decode.decode_planes``: no chroma
  upsampling, no colour conversion) - the cheaper decode ``ptt`` starts from for a whole-image resize.

Every system reads the same images in its own child process (peers in ``.venv-peers``), batch 4, 2 workers (DALI:
2 threads), 2 epochs; rounds run the systems in rotating order (interleaved). Ratios are per round (same round's
epoch 2), then median and min-max over rounds. Only ``pytorchtricks.clock`` reads a clock.

    make bench-detection-data
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Iterable
from typing import Any

from _child import emit, run_child  # benchmarks/ is on sys.path: these run as scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# torchvision's detection reference trains with -b 2 per GPU; 4 keeps 24 MP float32 batches in memory bounds
BATCH, WORKERS = 4, 2
SHORT, LONG, LSJ = 800, 1333, 1024

SYSTEMS: dict[str, tuple[str, str]] = {
    "tv-hflip": (
        "peers",
        "torchvision reference, hflip policy: CocoDetection + v2 wrapper, full-size float32",
    ),
    "tv-shortest": ("peers", "torchvision reference + RandomShortestSize(800, 1333) in the loader, float32"),
    "ptt": ("core", "ptt.make_detection_loader, shortest side 800 max 1333 + flip, uint8 padded to 32"),
    "dali-cpu": (
        "peers",
        "DALI CPU: readers.coco, decoders.image, bb_flip + flip, resize shorter 800 max 1333, pad",
    ),
    "floor": ("core", "decode floor: each photo decoded whole at the DCT scale of its 800/1333 output"),
    "floor-planes": (
        "core",
        "decode floor, planar: each photo decoded whole at that DCT scale to its Y/Cb/Cr planes (no colour conversion)",
    ),
    "tv-lsj": (
        "peers",
        "torchvision: CocoDetection + v2 ScaleJitter(1024) + RandomCrop(1024, pad) + flip, float32",
    ),
    "ptt-lsj": ("core", "ptt.make_detection_loader, LSJ 1024 (scale jitter + crop/pad + flip), uint8"),
    "floor-lsj": (
        "core",
        "decode floor for LSJ: each photo decoded whole at the DCT scale of its LSJ window",
    ),
}
BASELINES = {
    "ptt": ("tv-hflip", "tv-shortest", "dali-cpu", "floor", "floor-planes"),
    "ptt-lsj": ("tv-lsj", "floor-lsj"),
}


def _now() -> float:
    from pytorchtricks.clock import now_s

    return now_s()


# ------------------------------------------------------------------------------------------------ the input


def coco_root(photos: str, work: str, seed: int = 0) -> tuple[str, str]:
    """``(images folder, annotation file)``: the photos with 1-8 seeded boxes each, as a COCO instances JSON."""
    from pytorchtricks.data.photoset import coco_with_boxes

    return photos, coco_with_boxes(photos, os.path.join(work, "instances_train.json"), seed)


# ------------------------------------------------------------------------------------------------ systems


def _collate(batch: Any) -> Any:
    return tuple(zip(*batch, strict=True))  # references/detection/utils.collate_fn


def _tv(images: str, ann: str, policy: str) -> Iterable[Any]:
    import torch
    from torchvision import datasets, tv_tensors
    from torchvision.transforms import v2 as T

    if policy == "hflip":
        ts: list[Any] = [T.RandomHorizontalFlip(0.5), T.PILToTensor()]
    elif policy == "shortest":
        ts = [T.RandomShortestSize(SHORT, LONG), T.RandomHorizontalFlip(0.5), T.PILToTensor()]
    else:
        ts = [T.ScaleJitter((LSJ, LSJ)), T.RandomCrop(LSJ, pad_if_needed=True), T.RandomHorizontalFlip(0.5)]
        ts.append(T.PILToTensor())
    ts += [
        T.ToDtype(torch.float, scale=True),
        T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY),
        T.SanitizeBoundingBoxes(),
        T.ToPureTensor(),
    ]
    ds = datasets.CocoDetection(images, ann, transforms=T.Compose(ts))
    ds = datasets.wrap_dataset_for_transforms_v2(ds, target_keys=("boxes", "labels", "image_id"))
    return torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=_collate, persistent_workers=True
    )


def _ptt(images: str, ann: str, recipe: str) -> Iterable[Any]:
    import pytorchtricks as ptt

    ds = ptt.DetectionDataset.from_coco(images, ann)
    r = (
        ptt.DetectionRecipe.shortest_side(SHORT, LONG)
        if recipe == "shortest"
        else ptt.DetectionRecipe.lsj(LSJ)
    )
    cfg = ptt.DetectionLoaderConfig(num_workers=WORKERS, drop_last=False)
    return ptt.make_detection_loader(ds, BATCH, r, cfg)


class _Floor:
    """Key = batch indices -> the count decoded: each photo whole at the DCT scale its geometry needs."""

    def __init__(self, images: str, ann: str, recipe: str, planes: bool = False) -> None:
        import pytorchtricks as ptt

        self.planes = planes
        self.ds = ptt.DetectionDataset.from_coco(images, ann)
        self.recipe = (
            ptt.DetectionRecipe.shortest_side(SHORT, LONG)
            if recipe == "shortest"
            else ptt.DetectionRecipe.lsj(LSJ)
        )

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, idx: list[int]) -> int:
        import numpy as np

        from pytorchtricks.data.decode import decode_planes, decode_scaled, image_size

        for i in idx:
            raw = self.ds.read(i)
            g = self.recipe.plan(image_size(raw), np.random.default_rng(i), SHORT, None)
            if not self.planes or decode_planes(raw, g.dct_denom()) is None:
                decode_scaled(raw, g.dct_denom(), None)
        return len(idx)


def _floor(images: str, ann: str, recipe: str, planes: bool = False) -> Iterable[Any]:
    import torch

    ds = _Floor(images, ann, recipe, planes)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(len(ds))), BATCH, False)
    return torch.utils.data.DataLoader(
        ds, batch_size=None, sampler=sampler, num_workers=WORKERS, persistent_workers=True
    )


def _dali(images: str, ann: str) -> Iterable[Any]:
    from nvidia.dali import fn, pipeline_def, types

    with open(ann) as fh:
        n = len(json.load(fh)["images"])

    @pipeline_def(batch_size=BATCH, num_threads=WORKERS, device_id=None, seed=0)
    def pipe() -> Any:
        jpegs, boxes, labels = fn.readers.coco(
            file_root=images, annotations_file=ann, ltrb=True, ratio=True, random_shuffle=True,
            skip_empty=False, pad_last_batch=True, name="reader",
        )  # fmt: skip
        imgs = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        coin = fn.random.coin_flip()
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=coin)
        imgs = fn.flip(imgs, horizontal=coin)
        imgs = fn.resize(imgs, resize_shorter=SHORT, max_size=LONG)
        imgs = fn.pad(imgs, axes=(0, 1), align=32)
        return fn.transpose(imgs, perm=[2, 0, 1]), boxes, labels

    p = pipe()
    p.build()

    class Epoch:
        def __iter__(self) -> Any:
            import numpy as np
            import torch

            for b in range(-(-n // BATCH)):
                imgs, boxes, _ = p.run()
                keep = min(BATCH, n - b * BATCH)
                yield (
                    torch.from_numpy(np.asarray(imgs.as_tensor())[:keep]),
                    [boxes.at(k) for k in range(keep)],
                )

    return Epoch()


RUNNERS = {
    "tv-hflip": lambda i, a: _tv(i, a, "hflip"),
    "tv-shortest": lambda i, a: _tv(i, a, "shortest"),
    "tv-lsj": lambda i, a: _tv(i, a, "lsj"),
    "ptt": lambda i, a: _ptt(i, a, "shortest"),
    "ptt-lsj": lambda i, a: _ptt(i, a, "lsj"),
    "dali-cpu": _dali,
    "floor": lambda i, a: _floor(i, a, "shortest"),
    "floor-planes": lambda i, a: _floor(i, a, "shortest", planes=True),
    "floor-lsj": lambda i, a: _floor(i, a, "lsj"),
}


def _count(batch: Any) -> tuple[int, Any]:
    if isinstance(batch, int):
        return batch, "decoded only"
    if hasattr(batch, "images"):
        return int(batch.images.shape[0]), [list(batch.images.shape), str(batch.images.dtype)]
    first = batch[0]
    if isinstance(first, tuple):  # list collate: one tensor per image
        return len(first), ["list", str(first[0].dtype), list(first[0].shape)]
    return int(first.shape[0]), [list(first.shape), str(first.dtype)]


def run_one(system: str, images: str, ann: str, epochs: int) -> dict[str, Any]:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from data_loading import PssSampler

    torch.set_num_threads(1)
    with PssSampler() as mem:
        loader = RUNNERS[system](images, ann)
        times, counts, shape = [], [], None
        for _ in range(epochs):
            t0 = _now()
            n = 0
            for batch in loader:
                k, s = _count(batch)
                n += k
                shape = shape or s
            times.append(_now() - t0)
            counts.append(n)
    return {
        "system": system,
        "epoch_s": times,
        "images": counts,
        "images_per_s": [c / t for c, t in zip(counts, times, strict=True)],
        "peak_pss_bytes": mem.peak_bytes,
        "batch": shape,
    }


# ------------------------------------------------------------------------------------------------ parent


def _ratios(rows: list[dict[str, Any]], a: str, b: str) -> list[float]:
    """Per round: a's epoch-2 images/s over b's in the same round."""
    by = {(r["round"], r["system"]): r["images_per_s"][-1] for r in rows if "images_per_s" in r}
    return [
        by[(k, a)] / by[(k, b)] for k in sorted({r["round"] for r in rows}) if (k, a) in by and (k, b) in by
    ]


def markdown(rows: list[dict[str, Any]], n: int, env: dict[str, Any], notes: list[str]) -> str:
    ok = [r for r in rows if "images_per_s" in r]
    errors = {r["system"]: r["error"] for r in rows if "error" in r}
    rounds = sorted({r["round"] for r in rows})
    out = [
        f"# Detection input: {n} photos of 2-24 MP with boxes (COCO JSON), batch {BATCH}, {WORKERS} workers",
        "",
        f"{env.get('cpu')} ({env.get('cpu_count')} cores, class {env.get('cpu_class')}), torch {env.get('torch')}, "
        f"{env.get('time_utc')}, git {env.get('git_sha')}; {len(rounds)} interleaved round(s), 2 epochs each; "
        f"load average at the start {env.get('loadavg_1m_at_start')}.",
        "",
        "| system | epoch 1 img/s (median) | epoch 2 img/s (median, min-max) | peak PSS MiB | batch |",
        "|---|---|---|---|---|",
    ]
    for s in SYSTEMS:
        rs = [r for r in ok if r["system"] == s]
        if not rs:
            if s in errors:
                out.append(f"| {s} | - | - | - | not run: {errors[s]} |")
            continue
        e1 = statistics.median(r["images_per_s"][0] for r in rs)
        e2 = [r["images_per_s"][-1] for r in rs]
        peak = statistics.median(r["peak_pss_bytes"] for r in rs) / 2**20
        out.append(
            f"| {s} | {e1:.2f} | {statistics.median(e2):.2f} ({min(e2):.2f}-{max(e2):.2f}) | {peak:.0f} | "
            f"{rs[0]['batch']} |"
        )
    out += ["", "Ratios (epoch 2, paired per round; median, min-max over rounds):", ""]
    for ours, bases in BASELINES.items():
        for b in bases:
            r = _ratios(rows, ours, b)
            if r:
                out.append(
                    f"- `{ours}` / `{b}`: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}, {len(r)} rounds)"
                )
    out += ["", "Systems:", ""] + [f"- `{s}`: {d}" for s, (_, d) in SYSTEMS.items()]
    if notes:
        out += ["", "Notes:", ""] + [f"- {x}" for x in notes]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--images", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--work", default="/tmp/ptt-bench-data")
    ap.add_argument("--src", default=None, help="the >= 2 MP photos (default: built under --work)")
    from pytorchtricks.hardware import cpu_caps

    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class))
    ap.add_argument("--peers-python", default=os.path.join(ROOT, ".venv-peers", "bin", "python"))
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    ap.add_argument("--images-dir", help=argparse.SUPPRESS)
    ap.add_argument("--ann", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        emit(run_one(args.run_one, args.images_dir, args.ann, args.epochs))
        return 0

    from pytorchtricks.clock import environment, write_results
    from pytorchtricks.data.photoset import build_photo_set

    src = args.src or os.path.join(args.work, f"hires-2mp-{args.images}")
    if args.src is None:
        build_photo_set(src, args.images, min_mp=2.0, workers=WORKERS)
    images, ann = coco_root(src, os.path.join(args.work, f"detection-{args.images}"))
    env = environment()
    env["cpu_class"] = cpu_caps().cpu_class
    env["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    systems = [s for s in args.systems.split(",") if s]

    def child(s: str) -> dict[str, Any]:
        py = sys.executable if SYSTEMS[s][0] == "core" else args.peers_python
        if not os.path.exists(py):
            return {"error": "peers environment missing (make peers-env)"}
        cmd = [py, os.path.abspath(__file__), "--run-one", s, "--images-dir", images, "--ann", ann]
        return run_child([*cmd, "--epochs", str(args.epochs)], args.timeout_s, ROOT)

    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for s in systems[r % len(systems) :] + systems[: r % len(systems)]:
            row = {"system": s, "round": r, **child(s)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    md = markdown(rows, args.images, env, args.note)
    write_results(
        os.path.join(args.out, f"detection_data-{args.images}"), [{**x, "env": env} for x in rows], md
    )
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
