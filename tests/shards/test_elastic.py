"""Elastic order: the epoch's order is a function of (seed, epoch) only, ranks take equal parts, and a state
saved after k samples per rank resumes the epoch at another world size with nothing repeated or skipped."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from PIL import Image

from pytorchtricks.core import PttError
from pytorchtricks.shards.stream import ShardStream, remaining_positions, split_positions
from pytorchtricks.shards.writer import pack

N = 48


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """48 PNGs whose red channel is 5 x their id; packed ptt and tar in ~10 shards."""
    root = tmp_path_factory.mktemp("coded")
    for i in range(N):
        (root / f"c{i % 3}").mkdir(exist_ok=True)
        px = np.random.default_rng(i).integers(0, 256, (24, 24, 3), dtype=np.uint8)
        px[..., 0] = 5 * i
        Image.fromarray(px).save(root / f"c{i % 3}" / f"{i:02d}.png")
    out = {}
    for fmt in ("ptt", "tar"):
        out[fmt] = root.parent / f"{root.name}-{fmt}"
        pack(root, out[fmt], format=fmt, shard_size=6000 if fmt == "ptt" else 16000, workers=0)
    return out


def _id(item) -> int:
    from pytorchtricks.data.decode import decode_image

    return int(decode_image(bytes(item[0]))[0, 0, 0]) // 5


@pytest.mark.parametrize("split", ["blocked", "interleaved"])
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_any_resize_takes_every_position_once(split, uneven):
    """Stage 1 at W1 takes k per rank, stage 2 reads the rest at W2: with "drop" nothing repeats and fewer than W2
    are left out; with "pad" everything is read and fewer than W1 + W2 repeat."""
    for n, w1, k, w2 in itertools.product((37, 48), (1, 2, 3, 4), (0, 1, 5), (1, 2, 3, 5)):
        parts1 = split_positions(n, w1, split, uneven)
        taken = [int(p) for part in parts1 for p in part[:k]]
        rem = remaining_positions(n, [(w1, k)], split, uneven)
        parts2 = split_positions(len(rem), w2, split, uneven)
        assert len({len(p) for p in parts2}) == 1  # equal batches on every rank
        got = collections.Counter(taken + [int(rem[p]) for part in parts2 for p in part])
        if uneven == "drop":
            assert max(got.values()) == 1 and n - len(got) < w2
        else:
            assert set(got) == set(range(n)) and sum(got.values()) - n < w1 + w2


def test_the_global_order_does_not_depend_on_the_world_size(coded):
    """Blocked parts laid end to end (and interleaved parts woven) give the same sequence at every world size."""

    def order(world: int, split: str) -> list[int]:
        parts = [[_id(x) for x in ShardStream(coded["ptt"], seed=4, decode=None, rank=r, world_size=world,
                                               split=split, buffer_size=6)] for r in range(world)]  # fmt: skip
        if split == "blocked":
            return [i for p in parts for i in p]
        return [parts[j % world][j // world] for j in range(N)]

    one = order(1, "blocked")
    assert sorted(one) == list(range(N)) and one != list(range(N))
    for world in (2, 3, 4):
        assert order(world, "blocked") == one
        assert order(world, "interleaved") == one


@pytest.mark.parametrize("fmt", ["ptt", "tar"])
def test_stream_resumes_mid_epoch_at_another_world_size(coded, fmt):
    """4 ranks take 3 samples each, rank 0's state resumes the epoch on 2 ranks, then on 3: exactly the dataset."""
    taken = []
    for r in range(4):
        s = ShardStream(coded[fmt], seed=9, decode=None, rank=r, world_size=4, buffer_size=6)
        s.set_epoch(2)
        taken += [_id(x) for x in itertools.islice(iter(s), 3)]
        if r == 0:
            state = s.state_dict()
    assert state["consumed"] == 3 and state["world_size"] == 4 and state["epoch"] == 2
    for r in range(2):  # world size 2: takes 5 each, saves again
        s = ShardStream(coded[fmt], seed=9, decode=None, rank=r, world_size=2, buffer_size=6)
        s.load_state_dict(state)
        assert len(s) == (N - 12) // 2
        taken += [_id(x) for x in itertools.islice(iter(s), 5)]
        if r == 0:
            state2 = s.state_dict()
    assert state2["history"] == [[4, 3]] and state2["consumed"] == 5
    rest = []
    for r in range(3):  # world size 3: the remaining 26 -> 9 each, one padded repeat
        s = ShardStream(coded[fmt], seed=9, decode=None, rank=r, world_size=3, buffer_size=6)
        s.load_state_dict(state2)
        rest += [_id(x) for x in s]
    counts = collections.Counter(taken + rest)
    assert set(counts) == set(range(N)) and sum(counts.values()) == N + 1  # 26 = 3 x 9 - 1 padded repeat


def test_a_state_from_another_split_or_seed_is_refused(coded):
    s = ShardStream(coded["ptt"], seed=1, decode=None)
    with pytest.raises(PttError, match="split"):
        s.load_state_dict({**s.state_dict(), "split": "interleaved"})
    with pytest.raises(PttError, match="seed"):
        s.load_state_dict({**s.state_dict(), "seed": 2})
    # a state written before elastic resume (no world_size) still loads, read at this world size
    s.load_state_dict({"epoch": 0, "seed": 1, "consumed": 10})
    assert len(s) == N - 10


def test_loader_state_resumes_at_another_world_size_with_workers(coded):
    """make_loader over a ShardStream, 2 workers: 2 ranks x 2 batches, then the loader state of rank 1 resumes the
    epoch on 3 ranks; the ids of the epoch are the dataset once (plus padding)."""
    from pytorchtricks.tricks.data.make_loader import make_loader

    def loader(rank: int, world: int):
        s = ShardStream(coded["ptt"], seed=2, decode=None, rank=rank, world_size=world, buffer_size=6)
        return make_loader(s, 4, crop=None, flip=False, num_workers=2, drop_last=False)

    seen = []
    for r in range(2):
        ld = loader(r, 2)
        ld.set_epoch(1)
        for x, _ in itertools.islice(iter(ld), 2):
            seen += (x[:, 0, 0, 0] // 5).tolist()
        state = ld.state_dict()
    assert state["batches"] == 2 and state["stream"]["consumed"] == 8 and state["stream"]["epoch"] == 1
    for r in range(3):
        ld = loader(r, 3)
        ld.load_state_dict(state)
        seen += [int(v) for x, _ in ld for v in (x[:, 0, 0, 0] // 5)]
    counts = collections.Counter(seen)
    assert set(counts) == set(range(N)) and sum(counts.values()) == N + 1  # 32 left = 3 x 11 - 1 padded
