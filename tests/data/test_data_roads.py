"""The two data roads CONTRIBUTING.md writes out ("The data roads"), walked for real: tune's ``--data`` to the decode
call, and ``make_detection_loader``'s dataset to the decode call.

Each road is read twice, as the interpreter runs it (``sys.setprofile``, no mock):

- the call stack at the first decode (``data.decode``'s ``decode_*``): every room (module) on it is visited once -
  one contiguous stretch, no climb back into a room already left;
- the path probes on the whole road (``detection_layout``, ``is_url``, ``split_folders``, ``load_manifest``): each
  runs at most once per road, so no path is inspected twice.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pytorchtricks as ptt

PROBES = {
    ("pytorchtricks.data.detection", "detection_layout"),
    ("pytorchtricks.shards.remote", "is_url"),
    ("pytorchtricks.data.folder", "split_folders"),
    ("pytorchtricks.shards.layout", "load_manifest"),
}
DECODERS = ("pytorchtricks.data.decode", "pytorchtricks.data.decode_yuv")


def walk(fn: Callable[[], Any]) -> tuple[list[tuple[str, str]], Counter[tuple[str, str]]]:
    """(the pytorchtricks frames on the stack at the first decode call, outermost first; the probes' call counts)."""
    stack: list[tuple[str, str]] = []
    probes: Counter[tuple[str, str]] = Counter()

    def prof(frame: Any, event: str, _: Any) -> None:
        if event != "call":
            return
        key = (frame.f_globals.get("__name__", ""), frame.f_code.co_name)
        if key in PROBES:
            probes[key] += 1
        if not stack and key[0] in DECODERS and key[1].lstrip("_").startswith("decode"):
            f = frame
            while f is not None:
                mod = f.f_globals.get("__name__", "")
                if mod.startswith("pytorchtricks"):
                    stack.append((mod, f.f_code.co_name))
                f = f.f_back
            stack.reverse()

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return stack, probes


def _revisited(stack: list[tuple[str, str]]) -> list[str]:
    runs = [m for m, _ in itertools.groupby(mod for mod, _ in stack)]
    return sorted(m for m, n in Counter(runs).items() if n > 1)


@pytest.fixture(scope="module")
def class_root(tmp_path_factory: pytest.TempPathFactory, photo_set: list[dict[str, Any]]) -> Path:
    root = tmp_path_factory.mktemp("road") / "photos"
    for i, p in enumerate(photo_set):
        d = root / "train" / ("a" if i % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        (d / p["name"]).write_bytes(p["jpeg"])
    (root / "val" / "a").mkdir(parents=True)
    return root


def test_tunes_data_road_visits_each_room_once_and_reads_the_path_once(class_root):
    from pytorchtricks.tune.workload import build_workload

    stack, probes = walk(
        lambda: build_workload(
            "torch.nn:Flatten", str(class_root), batch_size=2, input_size=32, num_workers=0
        )
    )
    assert stack, "the road reached no decode"
    assert stack[0] == ("pytorchtricks.tune.workload", "build_workload")
    assert stack[-1][0] in DECODERS
    assert not _revisited(stack), stack
    assert max(probes.values()) == 1, probes


def test_the_detection_loaders_road_visits_each_room_once_and_reads_the_path_once(coco_root):
    recipe = ptt.DetectionRecipe.shortest_side(320, 533)
    cfg = ptt.DetectionLoaderConfig(num_workers=0, shuffle=False)

    stack, probes = walk(lambda: next(iter(ptt.make_detection_loader(str(coco_root), 2, recipe, cfg))))
    assert stack and stack[-1][0] in DECODERS
    assert not _revisited(stack), stack
    assert max(probes.values()) == 1, probes
