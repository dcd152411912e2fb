"""Every sample read back exactly once, with identical bytes and labels, per format, workers and ranks."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch

from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.stream import ShardStream


def _collate(batch):
    return batch


def _stream_samples(path: Path, workers: int, world: int, epoch: int = 0) -> list[tuple[bytes, int]]:
    got = []
    for rank in range(world):
        s = ShardStream(path, seed=5, decode=None, rank=rank, world_size=world, buffer_size=8, batch_size=3)
        s.set_epoch(epoch)
        dl = torch.utils.data.DataLoader(s, batch_size=3, num_workers=workers, collate_fn=_collate)
        rank_got = [(bytes(x), int(lab)) for b in dl for x, lab, _ in b]
        assert len(rank_got) == len(s)
        got += rank_got
    return got


@pytest.mark.parametrize("fmt", ["ptt", "lmdb"])
def test_dataset_round_trip_bytes_and_labels(packs, photo_bytes, fmt):
    ds = ShardDataset(packs[fmt], decode=None)
    assert len(ds) == len(photo_bytes)
    got = collections.Counter()
    for i in range(len(ds)):
        data, label, _extras = ds[i]
        assert photo_bytes[data] == label == ds.labels[i]
        got[data] += 1
    assert set(got) == set(photo_bytes) and max(got.values()) == 1
    assert ds.classes == ["lomiri", "mate", "plasma"]
    assert isinstance(ds.labels, np.ndarray)


@pytest.mark.parametrize("fmt", ["ptt", "tar"])
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("world", [1, 2])
def test_stream_covers_every_sample_once(packs, photo_bytes, fmt, workers, world):
    got = _stream_samples(packs[fmt], workers, world)
    counts = collections.Counter(data for data, _ in got)
    assert set(counts) == set(photo_bytes)
    assert max(counts.values()) == 1
    assert all(photo_bytes[d] == lab for d, lab in got)


def test_stream_order_independent_of_workers_and_changes_per_epoch(packs):
    a = [d for d, _ in _stream_samples(packs["ptt"], 0, 1)]
    b = [d for d, _ in _stream_samples(packs["ptt"], 2, 1)]
    c = [d for d, _ in _stream_samples(packs["ptt"], 0, 1, epoch=1)]
    assert a == b  # an in-order DataLoader yields the rank's order whatever the worker count
    assert a != c and sorted(a) == sorted(c)


@pytest.mark.parametrize("fmt", ["ptt", "tar"])
def test_stream_resume_mid_epoch(packs, fmt):
    s = ShardStream(packs[fmt], seed=2, decode=None, buffer_size=10)
    s.set_epoch(3)
    full = [bytes(x) for x, _, _ in s]
    it = iter(s)
    for _ in range(17):
        next(it)
    state = s.state_dict()
    assert {k: state[k] for k in ("epoch", "seed", "consumed", "world_size")} == {
        "epoch": 3,
        "seed": 2,
        "consumed": 17,
        "world_size": 1,
    }
    resumed = ShardStream(packs[fmt], seed=2, decode=None, buffer_size=10)
    resumed.load_state_dict(state)
    assert [bytes(x) for x, _, _ in resumed] == full[17:]
    # with workers, the loop's own count is the state; the stream knows the loader's batch size
    resumed = ShardStream(packs[fmt], seed=2, decode=None, buffer_size=10, batch_size=4)
    resumed.load_state_dict(s.state_dict(consumed=30))
    dl = torch.utils.data.DataLoader(resumed, batch_size=4, num_workers=2, collate_fn=_collate)
    assert [bytes(x) for b in dl for x, _, _ in b] == full[30:]


def test_decoded_images_and_transform(packs):
    ds = ShardDataset(packs["ptt"], transform=lambda a: a[:16, :16])
    img, _label, _ = ds[0]
    assert img.shape == (16, 16, 3) and img.dtype == np.uint8
    s = ShardStream(packs["tar"], decode="auto")
    img, _label, extras = next(iter(s))
    assert img.ndim == 3 and "__key__" in extras


def test_raw_pack_yields_arrays(photos, tmp_path):
    from pytorchtricks.data.decode import decode_image, resize_array
    from pytorchtricks.shards.writer import pack

    for fmt in ("ptt", "tar"):
        pack(photos, tmp_path / fmt, format=fmt, raw=True, max_side=64, workers=0, shuffle=False)
    ds = ShardDataset(tmp_path / "ptt", decode=None)
    arr, label, _ = ds[0]
    first = sorted((photos / "lomiri").iterdir())[0].read_bytes()
    want = resize_array(
        decode_image(first, backend="simplejpeg"), arr.shape[:2], area=True
    )  # area filter, once
    assert arr.dtype == np.uint8 and max(arr.shape[:2]) == 64 and label == 0
    np.testing.assert_array_equal(arr, want)
    tar_arr = next(iter(ShardStream(tmp_path / "tar", shuffle=False, decode=None)))[0]
    np.testing.assert_array_equal(tar_arr, arr)


def test_csv_source_with_extras(photos, tmp_path):
    from pytorchtricks.shards.writer import pack

    files = sorted(photos.rglob("*.jpg"))[:5]
    lines = ["path,label,caption"] + [
        f"{f},{'cat' if i % 2 else 'dog'},photo {i}" for i, f in enumerate(files)
    ]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    pack(tmp_path / "list.csv", tmp_path / "out", workers=0, shuffle=False)
    ds = ShardDataset(tmp_path / "out", decode=None)
    assert ds.classes == ["cat", "dog"]
    data, label, extras = ds[1]
    assert data == files[1].read_bytes() and label == 0 and extras == {"caption": "photo 1"}


@pytest.mark.parametrize("fmt", ["ptt", "lmdb"])
def test_dataset_in_dataloader_workers(packs, photo_bytes, fmt):
    ds = ShardDataset(packs[fmt], decode=None)
    ds.read_raw(0)  # open files in the parent: workers must reopen their own (LMDB lazily, lock=False)
    dl = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=_collate)
    got = collections.Counter(bytes(x) for b in dl for x, _, _ in b)
    assert set(got) == set(photo_bytes) and max(got.values()) == 1


def test_dataset_holds_no_per_sample_python_objects(packs):
    """Copy-on-write trap: per-sample state must live in numpy buffers, not Python lists/dicts."""
    ds = ShardDataset(packs["ptt"], decode=None)
    ds.read_raw(0)
    for name, value in vars(ds).items():
        if isinstance(value, list | tuple | dict | set):
            assert len(value) < len(ds), name
    assert isinstance(ds.labels, np.ndarray) and isinstance(ds._index, np.memmap)


def test_stream_config_is_the_keywords_as_one_value(tmp_path):
    from PIL import Image

    from pytorchtricks.core import PttError
    from pytorchtricks.shards.stream import StreamConfig
    from pytorchtricks.shards.writer import pack

    for i in range(10):
        (tmp_path / "src" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / "src" / f"c{i % 2}" / f"{i}.png")
    pack(tmp_path / "src", tmp_path / "p", format="tar", shard_size="1KB", workers=0)
    opts = {"seed": 3, "decode": None, "buffer_size": 4, "rank": 1, "world_size": 2, "uneven": "drop"}

    def read(s: ShardStream) -> list[tuple[bytes, int]]:
        s.set_epoch(2)
        return [(bytes(x), int(lab)) for x, lab, _ in s]

    by_kw = read(ShardStream(tmp_path / "p", **opts))
    by_cfg = read(ShardStream(tmp_path / "p", config=StreamConfig(**opts)))
    assert by_cfg == by_kw and len(by_kw) == 5
    with pytest.raises(PttError, match=r"not both \(got seed, shuffle too\)"):
        ShardStream(tmp_path / "p", StreamConfig(**opts), shuffle=False, seed=1)
