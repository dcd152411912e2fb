"""Ultralytics YOLO's data pipeline through pytorchtricks, in one line: ``ptt.ultralytics.accelerate(model)``.

Why: Ultralytics' ``load_image`` decodes every photo at full size (``cv2.imread``) and then shrinks it to ``imgsz``;
on 12-24 MP photos that decode is most of the loader's time. Accelerated, its datasets (detect, segment, pose, obb)
read each JPEG at a DCT scale chosen from its header and resize it to the size ``load_image`` would have produced
(``match="stock"``: one scale finer than the largest, then their bilinear resize, so the pixels stay within 35 dB
of theirs; ``match="speed"``: the largest scale, the Y/Cb/Cr planes resampled to that size and made BGR there,
``data.geometry``); they read a ``ptt pack`` of the YOLO root
written for ``imgsz`` (labels in the pack: no full-size decode and no scan of image and label files); and
``cache='ram'`` becomes our node-shared arena at that size (``ptt.cache_in_ram``: one copy per node for every worker
and rank, admitted only if it fits RAM and ``/dev/shm``). Labels, mosaic, mixup, affine, HSV, letterbox and
collate stay Ultralytics' own.

Use:

    import pytorchtricks as ptt
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    ptt.ultralytics.accelerate(model)          # a trainer callback; returns the model
    model.train(data="data.yaml", imgsz=640)

The ``yolo`` CLI form: ``ptt yolo train model=yolov8n.yaml data=data.yaml imgsz=640`` runs Ultralytics' own
entry point with ``accelerate()`` installed for every trainer of the process (its arguments, as ``yolo`` takes
them). A pack: ``ptt pack ROOT packs/train --split train --max-side 640`` (and ``--split val`` likewise), then
point ``train:`` / ``val:`` of the data YAML at the pack folders.

When it changes nothing, it says so (a ``NoEffectWarning``): a task whose datasets are not ``YOLODataset``
(classify, semantic, depth, multi-modal); per image, files that are not JPEG, EXIF-rotated photos and non-3-channel
data go through the stock decode. A pack it cannot read (a COCO/VOC root's, or written smaller than ``imgsz``)
raises ``PttError`` with the command that makes one. Nothing is written into the dataset's folders: the label scan
that Ultralytics saves as ``labels/<split>.cache`` beside the labels goes under ``core.cache_root("ultralytics")``
(an existing one beside the labels is read, never rewritten); ``cache='disk'`` (``.npy`` beside each image) is left
stock, and said.

Workers: on CPU Ultralytics' trainer sets ``workers=0``; ``accelerate(model, workers=N)`` gives them back.
Left ``None``, a CPU with 4 or more cores gets a quarter of them (at least one) and a smaller one keeps 0 - each
worker takes a core from the step's own threads - and the log says which and why. On a GPU the trainer's own
number stands.

Caveats: Ultralytics is AGPL-3.0: it is imported only inside these functions (``pip install
'pytorchtricks[ultralytics]'``) and none of its code is copied here. Pixels differ from the stock load by the
decode's low-pass (``match="stock"``: >= 35 dB PSNR on the tests' >= 8 MP photos). DDP: under ``torchrun``, a
script calling ``accelerate(model)`` on every rank reads through ptt on all of them (Ultralytics runs the callback
on rank 0 only; the other ranks' dataset builder is swapped when ``accelerate`` is called), and ``cache='ram'`` is
then one arena per node. Multi-GPU runs that Ultralytics spawns itself (``device=0,1`` from one process) start
fresh processes without it: not accelerated (not tested here: no GPU).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from pytorchtricks.core import NoEffectWarning, require

__all__ = ["TASKS", "accelerate", "install", "run_yolo", "train_dataset", "train_loader"]

TASKS = ("detect", "segment", "pose", "obb")  # the tasks whose datasets are Ultralytics' YOLODataset
_SWAP = threading.RLock()


def _ultralytics() -> Any:
    return require("ultralytics", "ultralytics")


class _Accelerate:
    """The ``on_pretrain_routine_start`` callback: ``install(trainer, workers)``; deep-copyable (Ultralytics copies
    its callback lists for every trainer)."""

    def __init__(self, workers: int | None, match: str) -> None:
        self.workers, self.match = workers, match

    def __call__(self, trainer: Any) -> None:
        install(trainer, workers=self.workers, match=self.match)


def accelerate(model: Any = None, *, workers: int | None = None, match: str = "stock") -> Any:
    """Make ``model.train(...)`` read its data through pytorchtricks (see the module docstring); returns ``model``.

    ``model``: an Ultralytics ``YOLO`` (anything with ``add_callback``); ``None`` installs the callback for every
    trainer this process makes afterwards (what ``ptt yolo`` does). ``workers``: loader workers to give the
    trainer (``None``: the rule in the module docstring). Calling it twice adds nothing.

    Example:
        >>> import pytorchtricks as ptt
        >>> ptt.ultralytics.accelerate  # doctest: +ELLIPSIS
        <function accelerate at ...>
    """
    from pytorchtricks.integrations.ultralytics_data import MATCHES

    _ultralytics()
    if match not in MATCHES:
        from pytorchtricks.core import PttError

        raise PttError(f"match={match!r}: use one of {', '.join(MATCHES)}.")
    if workers is not None and workers < 0:
        from pytorchtricks.core import PttError

        raise PttError(f"workers must be >= 0 (or None for the rule), got {workers}.")
    cb = _Accelerate(workers, match)
    if model is None:
        from ultralytics.utils.callbacks.base import default_callbacks

        hooks = default_callbacks.setdefault("on_pretrain_routine_start", [])
        hooks[:] = [h for h in hooks if not isinstance(h, _Accelerate)] + [cb]
        return None
    if not hasattr(model, "add_callback") or not hasattr(model, "callbacks"):
        from pytorchtricks.core import PttError

        raise PttError(
            f"accelerate takes an Ultralytics model (YOLO(...)), got {type(model).__name__}; for the yolo CLI run "
            "`ptt yolo train ...`."
        )
    hooks = model.callbacks["on_pretrain_routine_start"]
    hooks[:] = [h for h in hooks if not isinstance(h, _Accelerate)] + [cb]
    if _rank() > 0:  # Ultralytics runs that callback on rank 0 only: the other ranks' builder is swapped here
        _swap_for_process(match)
    return model


def _rank() -> int:
    """This process's global rank under torchrun (``RANK``), -1 outside it."""
    try:
        return int(os.environ.get("RANK", "-1"))
    except ValueError:
        return -1


def _swap_for_process(match: str) -> None:
    """Every dataset Ultralytics' builder makes in this process is ours (a DDP rank other than 0, whose trainer
    runs no ``on_pretrain_routine_start`` callbacks); idempotent."""
    import ultralytics.data.build as build
    from ultralytics.utils import LOGGER

    from pytorchtricks.integrations.ultralytics_data import dataset_class

    with _SWAP:
        if not build.YOLODataset.__name__.startswith("Ptt"):
            ours: Any = dataset_class(build.YOLODataset, log=LOGGER)
            ours._ptt_match = match
            build.YOLODataset = ours


def install(trainer: Any, *, workers: int | None = None, match: str = "stock") -> bool:
    """Swap ``trainer.build_dataset`` for one whose datasets read through pytorchtricks and set its loader
    workers; True when installed. A trainer whose task has no ``YOLODataset`` is left as it is, with a
    ``NoEffectWarning`` saying why (what ``accelerate``'s callback runs)."""
    from ultralytics.utils import LOGGER

    task = getattr(trainer.args, "task", None)
    if task not in TASKS:
        warnings.warn(
            f"ptt.ultralytics.accelerate changes nothing for task={task}: it reads the datasets of "
            f"{', '.join(TASKS)} (Ultralytics' YOLODataset); this trainer keeps its stock loader.",
            NoEffectWarning,
            stacklevel=2,
        )
        return False
    if getattr(trainer.build_dataset, "_ptt", False):
        return True
    original = trainer.build_dataset

    def build_dataset(img_path: Any, mode: str = "train", batch: int | None = None) -> Any:
        with _dataset_class_swapped(LOGGER, match):
            ds = original(img_path, mode, batch)
        if not type(ds).__name__.startswith("Ptt"):
            warnings.warn(
                f"ptt: the {mode} dataset is {type(ds).__name__}, not a YOLODataset: read by the stock loader.",
                NoEffectWarning,
                stacklevel=2,
            )
        elif getattr(trainer.args, "cache", None) == "disk":
            LOGGER.warning(
                "ptt: cache='disk' writes a full-size .npy beside every image (Ultralytics' own); left as it is - "
                "cache='ram' is our node-shared arena at imgsz."
            )
        return ds

    build_dataset._ptt = True  # type: ignore[attr-defined]
    trainer.build_dataset = build_dataset
    LOGGER.info(
        "ptt: datasets read through pytorchtricks (DCT-scaled JPEG decode to imgsz, ptt packs, cache='ram' as the "
        "node-shared arena); labels and augmentations stay Ultralytics'"
    )
    _set_workers(trainer, workers, LOGGER)
    return True


@contextlib.contextmanager
def _dataset_class_swapped(log: Any, match: str) -> Iterator[None]:
    """While a trainer builds a dataset, Ultralytics' builder makes our subclass of its ``YOLODataset``."""
    import ultralytics.data.build as build

    from pytorchtricks.integrations.ultralytics_data import dataset_class

    with _SWAP:
        stock = build.YOLODataset
        if stock.__name__.startswith("Ptt"):  # already ours for the whole process (a rank other than 0)
            yield
            return
        ours: Any = dataset_class(stock, log=log)
        ours._ptt_match = match
        build.YOLODataset = ours
        try:
            yield
        finally:
            build.YOLODataset = stock


def train_dataset(
    cfg: Any, img_path: Any, batch: int, data: dict[str, Any], stride: int, *, match: str | None = None
) -> Any:
    """The training dataset Ultralytics' trainer builds from its arguments ``cfg`` (``build_yolo_dataset``, mode
    ``train``: mosaic and its augmentations on): stock with ``match=None``, else read through pytorchtricks as
    ``accelerate(model, match=match)`` makes it. What ``ptt doctor run --tune`` measures, on the trainer's own
    arguments. ``cfg``: its ``args`` namespace or a dict of them."""
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import LOGGER, IterableSimpleNamespace

    ns = cfg if not isinstance(cfg, dict) else IterableSimpleNamespace(**cfg)
    if match is None:
        return build_yolo_dataset(ns, img_path, batch, data, mode="train", stride=stride)
    with _dataset_class_swapped(LOGGER, match):
        return build_yolo_dataset(ns, img_path, batch, data, mode="train", stride=stride)


def train_loader(ds: Any, batch: int, workers: int) -> Any:
    """Ultralytics' own training loader over ``ds`` (``build_dataloader``: its InfiniteDataLoader, sampler and
    collate), on CPU memory."""
    from ultralytics.data.build import build_dataloader

    return build_dataloader(ds, batch, workers, shuffle=True, rank=-1, pin_memory=False, device="cpu")


def _set_workers(trainer: Any, workers: int | None, log: Any) -> None:
    if workers is not None:
        trainer.args.workers = workers
        log.info(f"ptt: workers={workers} (asked)")
        return
    if getattr(trainer.device, "type", "cpu") not in ("cpu", "mps"):
        return  # the trainer's own number on a GPU
    cores = len(os.sched_getaffinity(0))
    if cores < 4:
        log.info(
            f"ptt: workers=0 kept on CPU: {cores} cores, and a loader worker would take one of them from the step's "
            "own threads (accelerate(model, workers=N) to choose)"
        )
        return
    trainer.args.workers = max(1, cores // 4)
    log.info(
        f"ptt: workers={trainer.args.workers} on CPU (the trainer set 0): {cores} cores, a quarter of them load "
        "while the step computes on the rest (accelerate(model, workers=N) to choose)"
    )


def run_yolo(argv: Sequence[str], *, match: str = "stock") -> int:
    """Ultralytics' ``yolo`` entry point on ``argv`` (``["train", "model=...", ...]``) with ``accelerate(match=...)``
    installed for every trainer of the process: what ``ptt yolo ...`` runs."""
    sys.argv[:] = ["yolo", *argv]  # in place: Ultralytics reads the list it captured at import
    accelerate(match=match)
    from ultralytics.cfg import entrypoint

    entrypoint()
    return 0
