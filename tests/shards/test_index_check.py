"""``layout.check_index`` checks the index in blocks: every block boundary must be checked as strictly as the whole
index was, and each of its two checks (shard order, class histogram) must name its own fault wherever it lies."""

from __future__ import annotations

import numpy as np
import pytest

from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards import layout


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "_CHECK_BLOCK", 4)  # 3 shards x 5 rows span several blocks


def _pack(fmt: str = "ptt") -> tuple[dict, np.ndarray]:
    index = np.zeros(15, layout.INDEX_DTYPE)
    index["shard"] = np.repeat(np.arange(3), 5)
    index["label"] = np.arange(15) % 2
    manifest = {
        "format": fmt,
        "shards": [{"count": 5}] * 3,
        "classes": ["a", "b"],
        "class_counts": np.bincount(index["label"]).tolist(),
    }
    return manifest, index


def test_a_sound_index_passes_in_blocks(small_blocks: None) -> None:
    layout.check_index("/pack", *_pack())
    layout.check_index("/pack", *_pack("tar"))


@pytest.mark.parametrize(
    "row, shard",
    [
        (4, 1),
        (5, 0),
        (8, 2),
        (14, 3),
        (0, 2**32 - 1),
    ],  # out of order at and inside block boundaries, or past the end
)
def test_shard_order_faults_are_found_in_any_block(small_blocks: None, row: int, shard: int) -> None:
    manifest, index = _pack()
    index["shard"][row] = shard
    with pytest.raises(ShardError, match="index rows do not match the manifest's shards"):
        layout.check_index("/pack", manifest, index)


@pytest.mark.parametrize("row, label", [(13, 1), (13, 7), (2, -1)])
def test_a_label_fault_in_a_later_block_names_the_labels(small_blocks: None, row: int, label: int) -> None:
    manifest, index = _pack()
    index["label"][row] = label if label != 1 else 1 - index["label"][row]
    with pytest.raises(ShardError, match="index labels do not give the manifest's class counts"):
        layout.check_index("/pack", manifest, index)
