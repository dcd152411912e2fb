"""The systems the Ultralytics benchmark compares, each one way to build Ultralytics' own dataset and loader:

- ``stock``: Ultralytics 8.4.190 as installed, reading the original photos (``cv2.imread`` + resize to imgsz).
- ``ptt-files``: the same after ``ptt.ultralytics.accelerate``, reading the original photos (DCT-scaled decode).
- ``ptt-pack``: the same after ``ptt.ultralytics.accelerate``, reading a ``ptt pack`` written for imgsz.

Everything here runs inside the benchmark's own venv (``make ultralytics-env``): Ultralytics is imported only in
these functions, never by the library. A system whose integration is not installed reports why instead of a number.
"""

from __future__ import annotations

import os
from typing import Any

SYSTEMS = {
    "stock": "Ultralytics 8.4.190 as installed: cv2.imread of the original photo, resize to imgsz",
    "ptt-files": "ptt.ultralytics.accelerate: the original photos through ptt's DCT-scaled JPEG decode",
    "ptt-pack": "ptt.ultralytics.accelerate: a ptt pack written for imgsz (no full-size decode, no label scan)",
}


def quiet() -> None:
    """Ultralytics without its console chatter, offline, settings in a private folder."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", "/tmp/ptt-ultra/yolo-config")
    os.environ.setdefault("YOLO_VERBOSE", "False")
    os.environ.setdefault(
        "PTT_CACHE_DIR", "/tmp/ptt-ultra/ptt-cache"
    )  # the integration's memos: ours to clear


def cfg(imgsz: int, cache: str | None, **over: Any) -> Any:
    """Ultralytics' default training configuration at ``imgsz`` (mosaic on, its own augmentations)."""
    quiet()
    from ultralytics.cfg import get_cfg
    from ultralytics.utils import DEFAULT_CFG

    return get_cfg(DEFAULT_CFG, {"imgsz": imgsz, "cache": cache or False, "plots": False, **over})


def data_dict(yaml_path: str) -> dict[str, Any]:
    """The set's data dictionary as Ultralytics' trainer reads it (names, nc, channels)."""
    quiet()
    from ultralytics.data.utils import check_det_dataset

    return dict(check_det_dataset(yaml_path))


def integration() -> Any:
    """ptt's Ultralytics integration (``ptt.ultralytics``), or a clear error naming what is missing."""
    try:
        import pytorchtricks.integrations.ultralytics as ptt_ultra
        import pytorchtricks.integrations.ultralytics_data  # noqa: F401  (its dataset class)
    except ImportError as e:
        raise RuntimeError(f"ptt.ultralytics is not in this checkout ({e}): only 'stock' can run") from e
    return ptt_ultra


def dataset(
    system: str,
    yaml_path: str,
    imgsz: int,
    cache: str | None,
    batch: int,
    pack: str | None,
    augment: bool = True,
) -> Any:
    """The system's training dataset over the set of ``yaml_path`` through Ultralytics' own ``build_yolo_dataset``
    (for the ptt systems: with its ``YOLODataset`` swapped for the integration's subclass of it, as
    ``accelerate``'s trainer callback does; ``ptt-pack`` reads ``pack`` in place of the image folder)."""
    quiet()
    import ultralytics.data.build as build

    data = data_dict(yaml_path)
    c = cfg(imgsz, cache)
    mode = "train" if augment else "val"
    if system == "stock":
        return build.build_yolo_dataset(c, data["train"], batch, data, mode=mode)
    integration()
    from pytorchtricks.integrations.ultralytics_data import dataset_class

    if system == "ptt-pack" and not (pack and os.path.exists(os.path.join(pack, "manifest.json"))):
        raise RuntimeError(f"ptt-pack needs the pack {pack}: run the benchmark with --prepare")
    stock = build.YOLODataset
    build.YOLODataset = dataset_class(stock)
    try:
        return build.build_yolo_dataset(
            c, pack if system == "ptt-pack" else data["train"], batch, data, mode=mode
        )
    finally:
        build.YOLODataset = stock


def loader(ds: Any, batch: int, workers: int) -> Any:
    """Ultralytics' own training loader (``build_dataloader``: InfiniteDataLoader, its collate, shuffle)."""
    from ultralytics.data.build import build_dataloader

    return build_dataloader(ds, batch, workers, shuffle=True, rank=-1, pin_memory=False, device="cpu")


def write_pack(root: str, dst: str, imgsz: int) -> None:
    """``ptt pack ROOT DST --split train --max-side IMGSZ`` (the integration's documented pack), in a child."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "pytorchtricks",
        "pack",
        root,
        dst,
        "--split",
        "train",
        "--max-side",
        str(imgsz),
    ]
    subprocess.run(cmd, check=True)


def pack_yaml(yaml_path: str, pack: str) -> str:
    """A data YAML whose train and val are ``pack`` (what the integration's docs say to do), beside the pack."""
    import yaml

    with open(yaml_path) as f:
        d = yaml.safe_load(f)
    d.update(path=os.path.dirname(pack), train=pack, val=pack)
    out = pack.rstrip("/") + ".yaml"
    with open(out, "w") as f:
        yaml.safe_dump(d, f)
    return out
