"""YOLO's boxes are normalised in the tables: once ``image_hw`` has learnt an image's size, ``target`` must still
scale them to pixels (a pack of a YOLO root stored them normalised, area 0, before the fix)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pytorchtricks.data.detection import open_detection
from pytorchtricks.data.detection_pack import target_json


def test_yolo_target_in_pixels_after_image_hw(
    photo_set: list[dict[str, Any]], writers: Any, tmp_path: Path
) -> None:
    writers.yolo(tmp_path, photo_set[:3])
    ds = open_detection(tmp_path)
    for i in range(len(ds)):
        want = photo_set[[p["name"] for p in photo_set].index(Path(ds.file(i)).name)]
        first = ds.target(i)["boxes"].numpy()
        ds.image_hw(i)  # learns the size: the boxes must not be taken for pixels from here on
        t = target_json(ds, i)
        np.testing.assert_allclose(np.asarray(t["boxes"]).reshape(-1, 4), want["boxes"], atol=1e-3)
        np.testing.assert_allclose(ds.target(i)["boxes"].numpy(), first)
        assert all(a > 1 for a in t["area"])
