"""The systems the Ultralytics benchmark compares, each one way to build Ultralytics' own dataset and loader:

- ``stock``: Ultralytics 8.4.190 as installed, reading the original photos (``cv2.imread`` + resize to imgsz).
- ``ptt-files``: the same after ``ptt.ultralytics.accelerate``, reading the original photos (DCT-scaled decode).
- ``ptt-files-speed``: the same with ``match="speed"`` (the largest DCT scale; lower PSNR against stock).
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
    "ptt-files-speed": "the same with match='speed': the largest DCT scale, planes resampled straight to imgsz",
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


def integration() -> Any:
    """ptt's Ultralytics integration (``ptt.ultralytics``), or a clear error naming what is missing."""
    try:
        import pytorchtricks.integrations.ultralytics as ptt_ultra
        import pytorchtricks.integrations.ultralytics_data  # noqa: F401  (its dataset class)
    except ImportError as e:
        raise RuntimeError(f"ptt.ultralytics is not in this checkout ({e}): only 'stock' can run") from e
    return ptt_ultra


def trainer(
    system: str,
    yaml_path: str,
    imgsz: int,
    cache: str | None,
    batch: int,
    pack: str | None,
) -> tuple[Any, str]:
    """Ultralytics' detection trainer for the set of ``yaml_path`` (its model only for its stride) and the folder
    its training dataset reads: for the ptt systems after ``ptt.ultralytics.install(trainer)`` (what
    ``accelerate``'s callback runs), ``ptt-pack`` reading ``pack`` in place of the image folder."""
    quiet()
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.nn.tasks import DetectionModel

    over = {
        "model": "yolov8n.yaml",
        "data": yaml_path,
        "imgsz": imgsz,
        "cache": cache or False,
        "batch": batch,
    }
    over.update(plots=False, device="cpu", project="/tmp/ptt-ultra/runs", name="datasets", exist_ok=True)
    t = DetectionTrainer(overrides=over)
    t.model = DetectionModel("yolov8n.yaml", nc=len(t.data["names"]), verbose=False)  # its stride
    img_path = t.data["train"]
    if system != "stock":
        ptt_ultra = integration()
        ptt_ultra.install(t, match="speed" if system == "ptt-files-speed" else "stock")
    if system == "ptt-pack":
        if not (pack and os.path.exists(os.path.join(pack, "manifest.json"))):
            raise RuntimeError(f"ptt-pack needs the pack {pack}: run the benchmark with --prepare")
        img_path = pack
    return t, img_path


def dataset(
    system: str,
    yaml_path: str,
    imgsz: int,
    cache: str | None,
    batch: int,
    pack: str | None,
    augment: bool = True,
) -> Any:
    """The system's training dataset over the set of ``yaml_path``, built as Ultralytics' detection trainer builds
    it (``DetectionTrainer.build_dataset``) by ``trainer``'s trainer."""
    t, img_path = trainer(system, yaml_path, imgsz, cache, batch, pack)
    return t.build_dataset(img_path, mode="train" if augment else "val", batch=batch)


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
