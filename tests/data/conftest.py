"""Real photos with boxes for the data-wing tests: a few Debian wallpapers, downscaled once per session, each with
boxes placed by a seeded generator (sizes from a few pixels to most of the image, some touching the edges)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytorchtricks.data.photoset import wallpaper_sources

N_PHOTOS = 6
LONG_SIDE = 1200  # downscaled for speed: still decoded at 1/2 and 1/4 by the small recipes of the tests


def place_boxes(h: int, w: int, rng: np.random.Generator, k: int) -> np.ndarray:
    """``k`` XYXY boxes on whole pixels inside an ``h`` x ``w`` image; one touches the right and bottom edges."""
    out = []
    for j in range(k):
        bw, bh = int(rng.integers(4, w // 2)), int(rng.integers(4, h // 2))
        x, y = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        if j == 0:
            x, y = w - bw, h - bh
        out.append([x, y, x + bw, y + bh])
    return np.asarray(out, np.float32).reshape(-1, 4)


@pytest.fixture(scope="session")
def photo_set() -> list[dict[str, Any]]:
    """``[{"name", "jpeg", "hw", "boxes", "labels"}]``: real photos (one without boxes) with seeded boxes."""
    from PIL import Image

    srcs = wallpaper_sources()
    if not srcs:
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    step = max(1, len(srcs) // N_PHOTOS)
    out = []
    rng = np.random.default_rng(31)
    for n, (_, path) in enumerate(srcs[::step][:N_PHOTOS]):
        img = Image.open(path)
        f = LONG_SIDE / max(img.size)
        img.draft("RGB", (int(img.size[0] * f), int(img.size[1] * f)))
        img = img.convert("RGB")
        f = LONG_SIDE / max(img.size)
        img = img.resize((round(img.size[0] * f), round(img.size[1] * f)), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        w, h = img.size
        k = 0 if n == 1 else int(rng.integers(1, 6))
        boxes = place_boxes(h, w, rng, k)
        labels = rng.integers(0, 3, len(boxes)).astype(np.int64)
        out.append(
            {
                "name": f"img{n:02d}.jpg",
                "jpeg": buf.getvalue(),
                "hw": (h, w),
                "boxes": boxes,
                "labels": labels,
            }
        )
    return out


CLASSES = ["cat", "dog", "tree"]
COCO_IDS = [1, 3, 7]  # COCO's ids are not contiguous; labels keep them


def write_coco(root: Path, photos: list[dict[str, Any]], split: str = "val") -> Path:
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    images, anns = [], []
    for n, p in enumerate(photos):
        (root / split / p["name"]).write_bytes(p["jpeg"])
        images.append({"id": 100 + n, "file_name": p["name"], "height": p["hw"][0], "width": p["hw"][1]})
        for b, lab in zip(p["boxes"].tolist(), p["labels"].tolist(), strict=True):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": 100 + n,
                    "category_id": COCO_IDS[lab],
                    "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                    "area": (b[2] - b[0]) * (b[3] - b[1]),
                    "iscrowd": 0,
                    "segmentation": [[b[0], b[1], b[2], b[1], b[2], b[3]]],
                }
            )
    cats = [{"id": i, "name": c} for i, c in zip(COCO_IDS, CLASSES, strict=True)]
    ann = root / "annotations" / f"instances_{split}.json"
    ann.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return ann


def write_yolo(root: Path, photos: list[dict[str, Any]], split: str | None = None) -> None:
    """``images[/split]/`` + ``labels[/split]/`` (ultralytics' layout with a split)."""
    img, labels = (
        (root / "images", root / "labels")
        if not split
        else (root / "images" / split, root / "labels" / split)
    )
    img.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    for p in photos:
        (img / p["name"]).write_bytes(p["jpeg"])
        h, w = p["hw"]
        lines = []
        for b, lab in zip(p["boxes"].tolist(), p["labels"].tolist(), strict=True):
            cx, cy, bw, bh = (
                (b[0] + b[2]) / 2 / w,
                (b[1] + b[3]) / 2 / h,
                (b[2] - b[0]) / w,
                (b[3] - b[1]) / h,
            )
            lines.append(f"{lab} {cx:.8f} {cy:.8f} {bw:.8f} {bh:.8f}")
        if lines:  # an image without boxes has no label file, as YOLO tools write it
            (labels / (p["name"][:-4] + ".txt")).write_text("\n".join(lines) + "\n")


def write_voc(root: Path, photos: list[dict[str, Any]], split: str | None = None) -> None:
    """``JPEGImages/`` + ``Annotations/``; with ``split`` the photos' stems are listed in
    ``ImageSets/Main/<split>.txt`` (VOC's layout with splits)."""
    (root / "JPEGImages").mkdir(parents=True, exist_ok=True)
    (root / "Annotations").mkdir(exist_ok=True)
    if split:
        (root / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
        with open(root / "ImageSets" / "Main" / f"{split}.txt", "a") as fh:
            fh.write("".join(p["name"][:-4] + "\n" for p in photos))
    for p in photos:
        (root / "JPEGImages" / p["name"]).write_bytes(p["jpeg"])
        h, w = p["hw"]
        objs = "".join(
            f"<object><name>{CLASSES[lab]}</name><difficult>0</difficult><bndbox><xmin>{int(b[0]) + 1}</xmin>"
            f"<ymin>{int(b[1]) + 1}</ymin><xmax>{int(b[2])}</xmax><ymax>{int(b[3])}</ymax></bndbox></object>"
            for b, lab in zip(p["boxes"].tolist(), p["labels"].tolist(), strict=True)
        )
        xml = (
            f"<annotation><filename>{p['name']}</filename><size><width>{w}</width><height>{h}</height>"
            f"<depth>3</depth></size>{objs}</annotation>"
        )
        (root / "Annotations" / (p["name"][:-4] + ".xml")).write_text(xml)


SPLITS = {"coco": ("train2017", "val2017"), "yolo": ("train", "val"), "voc": ("train", "val")}


def write_splits(fmt: str, root: Path, photos: list[dict[str, Any]]) -> tuple[str, str]:
    """A standard root with a train and a val split (COCO's ``train2017`` + ``val2017``, YOLO's and VOC's ``train``
    + ``val``): the first half of the photos in train, the rest in val. Returns the two split names."""
    train, val = SPLITS[fmt]
    half = len(photos) // 2
    write = {"coco": write_coco, "yolo": write_yolo, "voc": write_voc}[fmt]
    write(root, photos[:half], train)
    write(root, photos[half:], val)
    return train, val


@pytest.fixture(scope="session")
def coco_root(photo_set: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coco")
    write_coco(root, photo_set)
    return root


class Writers:
    """The root writers and the annotation set's names, as a fixture (test modules do not import conftest)."""

    coco = staticmethod(write_coco)
    yolo = staticmethod(write_yolo)
    voc = staticmethod(write_voc)
    splits = staticmethod(write_splits)
    classes = CLASSES
    coco_ids = COCO_IDS


@pytest.fixture(scope="session")
def writers() -> type[Writers]:
    return Writers
