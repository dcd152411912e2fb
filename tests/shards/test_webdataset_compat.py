"""Our tar shards read by the `webdataset` library, and its ShardWriter output read by ShardStream."""

from __future__ import annotations

import collections
import json

import pytest

from pytorchtricks.shards.stream import ShardStream

wds = pytest.importorskip("webdataset", reason="webdataset not installed (pip install 'pytorchtricks[dev]')")


def test_webdataset_reads_our_shards(packs, photo_bytes):
    manifest = json.loads((packs["tar"] / "manifest.json").read_text())
    url = str(packs["tar"] / manifest["pattern"])
    got = collections.Counter()
    for sample in wds.WebDataset(url, shardshuffle=False, empty_check=False):
        assert int(sample["cls"]) == photo_bytes[sample["jpg"]]
        got[sample["jpg"]] += 1
    assert set(got) == set(photo_bytes) and max(got.values()) == 1


def test_we_read_webdataset_shards(photo_bytes, tmp_path):
    items = list(photo_bytes.items())
    pattern = str(tmp_path / "wds-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=10, verbose=0) as sink:
        for i, (data, label) in enumerate(items):
            sink.write({"__key__": f"sample{i:05d}", "jpg": data, "cls": label, "json": {"i": i}})
    last = (len(items) - 1) // 10
    url = str(tmp_path / ("wds-{000000.." + f"{last:06d}" + "}.tar"))
    for workers_world in ((0, 1), (0, 2)):
        got = []
        for rank in range(workers_world[1]):
            s = ShardStream(url, seed=1, decode=None, rank=rank, world_size=workers_world[1], buffer_size=5)
            got += [(d, lab, ex["i"]) for d, lab, ex in s]
        assert sorted(i for _, _, i in got) == list(range(len(items)))
        assert all(photo_bytes[d] == lab for d, lab, _ in got)
