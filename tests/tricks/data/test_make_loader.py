"""make_loader: exactly once per epoch across workers and simulated ranks (cache on/off), seeding, outputs."""

from __future__ import annotations

import glob
import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError, PttWarning
from pytorchtricks.data.decode import resize_array
from pytorchtricks.data.images import rrc_box
from pytorchtricks.tricks.data.make_loader import _photo_bytes, make_loader

N = 37  # prime: no batch size or world size divides it

# drop_last's notice and cache_in_ram's arena notice are tested where they are meant; elsewhere they are noise
pytestmark = pytest.mark.filterwarnings("ignore::pytorchtricks.core.PttWarning")


@pytest.fixture(scope="module")
def jpegs() -> list[tuple[bytes, int]]:
    """JPEG bytes labelled by their index, so a label identifies the sample."""
    return [(raw, i) for i, (raw, _) in enumerate(_photo_bytes(N, (60, 80)))]


def _labels(loader: object) -> list[int]:
    return [int(v) for _, y in loader for v in y]  # type: ignore[attr-defined]


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_across_workers_and_ranks(jpegs, tmp_path, cache, workers):
    data = jpegs
    if cache:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error", NoEffectWarning
            )  # the cache must really be built here, not fall back
            data = ptt.cache_in_ram(jpegs, size=48, cache_dir=str(tmp_path), num_workers=0)
        assert isinstance(data, ptt.cache_in_ram.__globals__["CachedDataset"])
    for world in (1, 2):
        seen: list[int] = []
        for rank in range(world):
            loader = make_loader(
                data, 4, crop=32, num_workers=workers, drop_last=False, rank=rank, world_size=world, seed=3
            )
            labels = _labels(loader)
            assert len(loader) == -(-len(labels) // 4)
            seen += labels
        assert sorted(seen) == list(range(N)), f"world={world}: samples lost or repeated"


def test_drop_last_gives_equal_steps_per_rank_and_no_repeats(jpegs):
    per_rank = []
    seen: list[int] = []
    for rank in range(3):
        loader = make_loader(jpegs, 5, crop=16, num_workers=0, rank=rank, world_size=3)
        batches = list(loader)
        per_rank.append(len(batches))
        assert all(x.shape[0] == 5 for x, _ in batches)
        seen += [int(v) for _, y in batches for v in y]
    assert len(set(per_rank)) == 1 and per_rank[0] == (N // 3) // 5
    assert len(seen) == len(set(seen))
    assert loader.dropped_per_epoch == N - len(seen) == 7  # 37 -> 12 per rank -> 2 batches of 5 each


def test_drop_last_says_once_how_many_samples_it_drops(jpegs):
    with pytest.warns(
        PttWarning, match=r"drops 2 of 37 samples every epoch.*reshuffled.*drop_last=False"
    ) as rec:
        loader = make_loader(jpegs, 5, crop=16, num_workers=0)
    assert len(rec) == 1 and loader.dropped_per_epoch == 2
    assert len(_labels(loader)) == N - loader.dropped_per_epoch
    with pytest.warns(PttWarning, match=r"drops 7 of 37 .*world_size=3.*never seen"):  # said by rank 0 only
        make_loader(jpegs, 5, crop=16, num_workers=0, shuffle=False, rank=0, world_size=3)
    with pytest.warns(PttWarning, match=r"all of them: the loader yields no batch"):
        assert len(make_loader(jpegs[:3], 5, crop=16, num_workers=0)) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", PttWarning)
        assert make_loader(jpegs, 5, crop=16, num_workers=0, rank=1, world_size=3).dropped_per_epoch == 7
        kept = make_loader(jpegs, 5, crop=16, num_workers=0, drop_last=False)
        assert kept.dropped_per_epoch == 0 and len(_labels(kept)) == N
        assert make_loader(jpegs[:35], 5, crop=16, num_workers=0).dropped_per_epoch == 0  # 5 divides 35


def test_epochs_reshuffle_and_are_seeded_independent_of_workers(jpegs):
    a = make_loader(jpegs, 8, crop=24, num_workers=0, seed=1)
    b = make_loader(jpegs, 8, crop=24, num_workers=2, seed=1)
    ea, eb = [list(a) for _ in range(2)], [list(b) for _ in range(2)]
    for epoch in range(2):
        for (xa, ya), (xb, yb) in zip(ea[epoch], eb[epoch]):
            torch.testing.assert_close(xa, xb, rtol=0, atol=0)
            assert torch.equal(ya, yb)
    assert not torch.equal(ea[0][0][1], ea[1][0][1]), "epoch 2 must reshuffle"
    a.set_epoch(0)
    torch.testing.assert_close(next(iter(a))[0], ea[0][0][0], rtol=0, atol=0)
    c = make_loader(jpegs, 8, crop=24, num_workers=0, seed=2)
    assert not torch.equal(next(iter(c))[1], ea[0][0][1])


def test_outputs_are_uint8_nchw_with_int64_labels(jpegs):
    x, y = next(iter(make_loader(jpegs, 6, crop=(20, 30), num_workers=0)))
    assert x.shape == (6, 3, 20, 30) and x.dtype == torch.uint8
    assert y.dtype == torch.int64 and y.shape == (6,)
    assert x.float().std() > 0  # real pixels, not an empty buffer


def test_any_map_style_dataset_pil_tensor_and_crop_none():
    g = torch.Generator().manual_seed(0)
    tensors = [(torch.randint(0, 256, (3, 10, 12), dtype=torch.uint8, generator=g), i) for i in range(6)]
    pil = [(Image.fromarray(t.permute(1, 2, 0).numpy()), i) for t, i in tensors]
    for ds in (tensors, pil):
        x, y = next(iter(make_loader(ds, 6, crop=None, flip=False, shuffle=False, num_workers=0)))
        for k in range(6):
            assert torch.equal(x[k], tensors[int(y[k])][0])


def test_flip_is_exact_mirror_and_both_outcomes_occur():
    g = torch.Generator().manual_seed(1)
    ds = [(torch.randint(0, 256, (3, 7, 9), dtype=torch.uint8, generator=g), i) for i in range(40)]
    flipped = 0
    for x, y in make_loader(ds, 10, crop=None, flip=True, num_workers=0):
        for k in range(len(y)):
            src = ds[int(y[k])][0]
            if torch.equal(x[k], src.flip(-1)):
                flipped += 1
            else:
                assert torch.equal(x[k], src)
    assert 5 < flipped < 35


def test_decoded_crop_written_into_the_batch_equals_the_plain_path():
    # decoded pixels (RAM cache, tensors) are resized straight into the batch slot and flipped in place there
    from pytorchtricks.data.images import SampleMaker, sample_rng

    g = torch.Generator().manual_seed(2)
    maker = SampleMaker((16, 20), (0.08, 1.0), (3 / 4, 4 / 3), True)
    slot = np.empty((16, 20, 3), dtype=np.uint8)
    flips = 0
    for i in range(30):
        img = torch.randint(0, 256, (3, 37, 45), dtype=torch.uint8, generator=g)
        plain = maker(img, sample_rng(0, 0, i))
        into = maker(img, sample_rng(0, 0, i), out=slot)
        assert into is slot and np.array_equal(slot, plain)
        t, lf, h, w = rrc_box(37, 45, (0.08, 1.0), (3 / 4, 4 / 3), sample_rng(0, 0, i))
        unflipped = resize_array(img.permute(1, 2, 0).numpy()[t : t + h, lf : lf + w], (16, 20))
        flips += not np.array_equal(plain, unflipped)
        assert np.array_equal(plain, unflipped) or np.array_equal(plain, unflipped[:, ::-1])
    assert 5 < flips < 25


def test_stream_dataset_is_split_by_its_workers():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            for i in range(wid, 23, nw):
                yield torch.full((3, 8, 8), i, dtype=torch.uint8), i, {}

    loader = make_loader(Stream(), 4, crop=None, drop_last=False, num_workers=2)
    assert sorted(_labels(loader)) == list(range(23))
    assert loader.dropped_per_epoch == 0
    # a stream splits itself: with drop_last its remainder is unknown up front
    assert make_loader(Stream(), 4, crop=None, num_workers=0).dropped_per_epoch is None


def test_misuse_raises_with_the_fix():
    ds = [(torch.zeros(3, 8, 8, dtype=torch.uint8), 0), (torch.zeros(3, 9, 8, dtype=torch.uint8), 1)]
    with pytest.raises(PttError, match="crop=N"):
        next(iter(make_loader(ds, 2, crop=None, num_workers=0)))
    with pytest.raises(PttError, match="batch_size"):
        make_loader(ds, 0)
    with pytest.raises(PttError, match="rank"):
        make_loader(ds, 1, rank=2, world_size=2)
    with pytest.raises(PttError, match="image, label"):
        next(iter(make_loader([torch.zeros(3, 4, 4)] * 2, 2, num_workers=0)))


def _photo_tiles(tmp_path, n: int) -> str | None:
    srcs = sorted(glob.glob("/usr/share/backgrounds/mate/nature/*.jpg"))
    if not srcs:
        return None
    img = Image.open(srcs[0]).convert("RGB")
    img.draft("RGB", (img.size[0] // 4, img.size[1] // 4))
    for i in range(n):
        d = tmp_path / f"c{i % 2}"
        d.mkdir(exist_ok=True)
        box = (i * 7, i * 5, i * 7 + 160, i * 5 + 120)
        buf = io.BytesIO()
        img.crop(box).save(buf, "JPEG", quality=85)
        (d / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    return str(tmp_path)


def test_real_photo_folder_scaled_decode_matches_full_decode(tmp_path):
    root = _photo_tiles(tmp_path, 12)
    if root is None:
        pytest.skip("mate-backgrounds is not installed (apt-get install mate-backgrounds)")
    ds = ptt.JpegFolder(root)
    assert len(ds) == 12 and ds.classes == ["c0", "c1"]
    # scale 1 at the photos' own aspect ratio: the box is the whole image, the output the resized photo
    loader = make_loader(
        ds,
        12,
        crop=(60, 80),
        scale=(1.0, 1.0),
        ratio=(4 / 3, 4 / 3),
        flip=False,
        shuffle=False,
        num_workers=0,
    )
    x, y = next(iter(loader))
    assert y.tolist() == ds.labels.tolist()
    for k in (0, 11):
        ref = np.asarray(Image.open(ds.path(k)).convert("RGB").resize((80, 60), Image.Resampling.BOX))
        err = np.abs(x[k].permute(1, 2, 0).numpy().astype(int) - ref.astype(int)).mean()
        assert err < 6, (
            f"scaled decode differs from full decode + resize by {err:.1f} (mean abs, pixel units)"
        )


def test_no_effect_warning_not_raised_for_normal_use(jpegs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        next(iter(make_loader(jpegs, 4, crop=16, num_workers=0)))


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """37 lossless 8x8 images whose red channel is their id, packed as ptt and tar shards."""
    from pytorchtricks.shards.writer import pack

    src = tmp_path_factory.mktemp("src")
    for i in range(N):
        d = src / f"c{i % 3}"
        d.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (i, 200, 7)).save(d / f"{i:03d}.png")
    out = {}
    for fmt in ("ptt", "tar"):
        out[fmt] = str(tmp_path_factory.mktemp(fmt) / "pack")
        pack(str(src), out[fmt], format=fmt, workers=0, shard_size=300)  # several shards
    return out


def _ids(loader: object) -> list[int]:
    return [int(v) for x, _ in loader for v in x[:, 0, 0, 0]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("cache", [False, True])
def test_shard_dataset_exactly_once_across_workers_and_ranks(packs, tmp_path, cache):
    from pytorchtricks.shards.dataset import ShardDataset

    ds = ShardDataset(packs["ptt"], decode=None)
    if cache:
        ds = ptt.cache_in_ram(ds, size=None, cache_dir=str(tmp_path), num_workers=0)
    for world in (1, 2):
        seen: list[int] = []
        for rank in range(world):
            loader = make_loader(
                ds, 4, crop=None, flip=False, num_workers=2, drop_last=False, rank=rank, world_size=world
            )
            seen += _ids(loader)
        assert sorted(seen) == list(range(N))


def test_shard_stream_exactly_once_across_workers_and_ranks(packs):
    from pytorchtricks.shards.stream import ShardStream

    for world in (1, 2):
        for uneven in ("pad", "drop"):
            seen: list[int] = []
            for rank in range(world):
                stream = ShardStream(
                    packs["tar"], seed=0, decode=None, rank=rank, world_size=world, uneven=uneven
                )
                seen += _ids(make_loader(stream, 4, crop=None, flip=False, num_workers=2, drop_last=False))
            # N is prime: at world size 2 "pad" repeats one sample on the last rank, "drop" leaves one out
            extra = (-N) % world if uneven == "pad" else -(N % world)
            assert len(seen) == N + extra and len(set(seen)) == N + min(extra, 0)
            assert set(seen) <= set(range(N))


def test_shard_stream_augmentations_do_not_depend_on_the_worker_count(tmp_path):
    """RandomResizedCrop + flip over a ShardStream: each sample's crop is a function of (seed, epoch, sample), so
    0 and 2 workers give every sample the same pixels (the order may differ), and the next epoch draws anew."""
    from pytorchtricks.shards.stream import ShardStream
    from pytorchtricks.shards.writer import pack

    src = tmp_path / "src"
    ramp = np.tile(np.arange(0, 240, 5, dtype=np.uint8), (48, 1))  # 48x48: the crop and flip show in green
    for i in range(20):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        img = np.stack([np.full_like(ramp, 10 * i), ramp, ramp.T], axis=-1)  # red: the sample's id
        Image.fromarray(img).save(src / f"c{i % 2}" / f"{i:02d}.png")
    pack(str(src), str(tmp_path / "p"), format="tar", workers=0, shard_size=2000)

    def by_id(workers: int, epoch: int) -> dict[int, bytes]:
        loader = make_loader(ShardStream(str(tmp_path / "p"), seed=0, decode=None), 4, crop=16, num_workers=workers,
                             drop_last=False, seed=3)  # fmt: skip
        loader.set_epoch(epoch)
        return {round(float(x[k, 0].float().mean()) / 10): x[k].numpy().tobytes() for x, _ in loader
                for k in range(len(x))}  # fmt: skip

    zero, two = by_id(0, 0), by_id(2, 0)
    assert sorted(zero) == list(range(20)) and zero == two
    assert sum(a != b for a, b in zip(zero.values(), (by_id(0, 1)[k] for k in zero), strict=True)) > 10


def test_a_shard_datasets_transform_is_refused_and_on_error_skip_is_honoured(packs, tmp_path):
    """make_loader reads stored records: a ShardDataset's transform= would silently not run, so it is refused;
    on_error="skip" drops a corrupt sample from its batch (with a warning), "raise" raises."""
    import shutil

    from pytorchtricks.core import PttWarning
    from pytorchtricks.data.errors import ShardError
    from pytorchtricks.shards.dataset import ShardDataset

    with pytest.raises(ptt.PttError, match="transform= would not run"):
        make_loader(ShardDataset(packs["ptt"], decode=None, transform=lambda x: x), 4, crop=None)
    bad = tmp_path / "bad"
    shutil.copytree(packs["ptt"], bad)
    import json

    rows = np.load(bad / "index.npy")
    shard, offset = int(rows["shard"][5]), int(rows["offset"][5])
    path = bad / json.loads((bad / "manifest.json").read_text())["shards"][shard]["name"]
    data = bytearray(path.read_bytes())
    data[offset + 20] ^= 0xFF  # sample 5's record: its CRC no longer matches
    path.write_bytes(bytes(data))
    kw = {"crop": None, "flip": False, "shuffle": False, "drop_last": False, "num_workers": 0}
    with pytest.warns(PttWarning, match="skipped a bad sample"):
        ids = _ids(make_loader(ShardDataset(str(bad), decode=None, on_error="skip"), 4, **kw))
    good = _ids(make_loader(ShardDataset(packs["ptt"], decode=None), 4, **kw))  # stored order
    assert ids == good[:5] + good[6:]
    with pytest.raises(ShardError, match="CRC"):
        _ids(make_loader(ShardDataset(str(bad), decode=None), 4, **kw))


def test_make_loader_returns_one_type_and_a_device_loader_prefetches(jpegs):
    """Whatever the device, make_loader returns a Loader (len, set_epoch, dropped_per_epoch); given a device
    its batches come through prefetch_to_device - the same batches (checked here on the CPU path of it)."""
    import torch

    from pytorchtricks.tricks.data._runtime import Loader

    plain = make_loader(jpegs, 4, crop=32, num_workers=0, seed=1)
    assert isinstance(plain, Loader) and plain.device is None
    ahead = make_loader(jpegs, 4, crop=32, num_workers=0, seed=1)
    ahead.device = torch.device("cpu")  # what make_loader sets for a CUDA device; the CPU prefetch path here
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        ahead.set_epoch(epoch)
        a, b = list(plain), list(ahead)
        assert len(a) == len(b) == len(plain) and all(
            torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(a, b, strict=True)
        )


def test_a_loader_config_gives_the_same_batches_as_its_keywords():
    import pytorchtricks as ptt
    from pytorchtricks.core import PttError

    ds = [(torch.randint(0, 255, (3, 40, 50), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)), i % 3)
          for i in range(12)]  # fmt: skip
    kw = dict(crop=32, num_workers=0, seed=5, scale=(0.5, 1.0))
    a = [x for x, _ in ptt.make_loader(ds, 4, **kw)]
    b = [x for x, _ in ptt.make_loader(ds, 4, ptt.LoaderConfig(**kw))]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(PttError, match="not both"):
        ptt.make_loader(ds, 4, ptt.LoaderConfig(crop=32), num_workers=0)
    with pytest.raises(PttError, match="unknown option 'num_worker': did you mean 'num_workers'"):
        ptt.make_loader(ds, 4, num_worker=0)  # the keywords are LoaderConfig's fields, checked against them
