"""The data doctor on detection data (a COCO / YOLO / VOC root or a detection pack): a batch built as
``make_detection_loader`` builds it, one stage at a time (``data.detection_stages``), then the loader itself with
its workers; the first fix per stage in detection's terms.
"""

from __future__ import annotations

from typing import Any

from pytorchtricks.data.detection_stages import STAGES
from pytorchtricks.data.detection_stages import time_detection_batches as detection_serial
from pytorchtricks.data.recipes import DetectionRecipe

__all__ = [
    "FIXES",
    "STAGES",
    "detection_loader",
    "detection_serial",
    "holds_boxes",
    "recipe_of",
    "rejects_note",
]

FIXES = {
    "read": "pack the root into shards on local disk (ptt pack ROOT DST, the boxes kept as JSON), or keep the "
    "decoded images in RAM (cache_in_ram at the training size)",
    "decode": "decode smaller: pack once with --resize to the training size (ptt pack ROOT DST --resize N: the "
    "boxes scale with the images), or keep the decoded images in RAM (cache_in_ram)",
    "augment": "fewer boxes or polygons per image to map, or a recipe without crops",
    "collate": "a fixed canvas (the ssd / lsj recipes) instead of padding each batch to its largest image",
    "host_to_device": "pin memory and copy uint8 on a side stream, normalize on the device (prefetch_to_device)",
}


BATCH_SIZE = 4  # the default batch of detection data: a few full-size images, as detectors train per device


def holds_boxes(dataset: Any) -> bool:
    """Detection data: ``open_detection``'s dataset (or any with ``task == "detection"``, torchvision's detection
    datasets) or a pack whose manifest says it holds boxes."""
    import json
    import os

    from pytorchtricks.data.detection import is_detection_dataset

    if is_detection_dataset(dataset):
        return True
    manifest = os.path.join(str(getattr(dataset, "path", "") or ""), "manifest.json")
    if not os.path.isfile(manifest):
        return False
    with open(manifest, encoding="utf-8") as fh:
        return "detection" in json.load(fh)


def recipe_of(recipe: DetectionRecipe | str) -> DetectionRecipe:
    """A recipe by name (``make_detection_loader``'s: shortest_side, multiscale, lsj, ssd) or as given."""
    from pytorchtricks.tricks.data.make_detection_loader import detection_recipe

    return detection_recipe(recipe)


def detection_loader(dataset: Any, batch_size: int, recipe: DetectionRecipe, workers: int) -> Any:
    """``make_detection_loader`` as the doctor times it: training's shuffle and aspect groups, ``workers``
    processes started for this measurement only."""
    from pytorchtricks.tricks.data.make_detection_loader import DetectionLoaderConfig, make_detection_loader

    cfg = DetectionLoaderConfig(num_workers=workers, persistent_workers=False)
    return make_detection_loader(dataset, batch_size, recipe, cfg)


def rejects_note(dataset: Any) -> list[str]:
    """A note on the annotations left out when the root was read (``on_error="skip"``), or none."""
    rejects = getattr(dataset, "rejects", None) or []
    if not rejects:
        return []
    r = rejects[0]
    first = f"{r['file']}" + (f", annotation {r['annotation']}" if r.get("annotation") is not None else "")
    return [
        f"{len(rejects)} bad annotation(s) left out of the measurement (the first: {first}: {r['reason']}); "
        "`ptt inspect` on the root lists them all"
    ]
