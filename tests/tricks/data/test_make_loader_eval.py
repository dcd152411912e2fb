"""make_loader(mode="eval"): torchvision's Resize(256) + CenterCrop(224) on real photos, every sample once, in order."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import pytorchtricks as ptt
from pytorchtricks.core import PttError, PttWarning
from pytorchtricks.data import decode
from pytorchtricks.data.photoset import wallpaper_sources
from pytorchtricks.tricks.data.make_loader import make_loader

pytestmark = pytest.mark.filterwarnings(
    "ignore::pytorchtricks.core.PttWarning"
)  # cache_in_ram's arena notice

# (width, height): short sides that pick each DCT scale (2100 -> 1/8, 1400 and 1024 -> 1/4, 1023 and 800 -> 1/2),
# portrait and landscape, full decode (480, 375) and a photo smaller than 256 (enlarged)
SIZES = [
    (2300, 2100),
    (2200, 1400),
    (1400, 2200),
    (1100, 800),
    (1030, 1024),
    (1023, 1023),
    (640, 480),
    (375, 500),
]
SIZES += [(300, 200)]
PSNR_DB = 30.0  # bound: the DCT-scaled decode is another low-pass than PIL's antialiased bilinear resize


@pytest.fixture(scope="module")
def photos() -> list[tuple[bytes, int]]:
    """Real-photo JPEGs (q90) of the sizes above, cut from the installed wallpapers; labelled by index."""
    srcs = [p for c, p in wallpaper_sources() if c == "mate"][:4]
    if not srcs:
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    out = []
    for k, (w, h) in enumerate(SIZES):
        img = Image.open(srcs[k % len(srcs)])
        img.draft("RGB", (w, h))
        img = img.convert("RGB")
        s = max(w / img.size[0], h / img.size[1])
        img = img.resize(
            (max(w, round(img.size[0] * s)), max(h, round(img.size[1] * s))), Image.Resampling.BICUBIC
        )
        buf = io.BytesIO()
        img.crop((0, 0, w, h)).save(buf, "JPEG", quality=90)
        out.append((buf.getvalue(), k))
    return out


def _reference(raw: bytes, resize: int = 256, crop: int = 224) -> np.ndarray:
    """PIL full decode + torchvision's Resize(resize) (bilinear, PIL) + CenterCrop(crop), written out in PIL."""
    img = Image.open(io.BytesIO(raw)).convert("RGB")
    w, h = img.size
    long = int(resize * max(w, h) / min(w, h))
    nw, nh = (resize, long) if w <= h else (long, resize)
    img = img.resize((nw, nh), Image.Resampling.BILINEAR)
    top, left = round((nh - crop) / 2), round((nw - crop) / 2)
    return np.asarray(img.crop((left, top, left + crop, top + crop)))


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-12))


def test_reference_is_torchvisions_eval_transform(photos):
    tv = pytest.importorskip("torchvision.transforms")
    ref = tv.Compose([tv.Resize(256), tv.CenterCrop(224)])
    for raw, _ in photos:
        assert np.array_equal(np.asarray(ref(Image.open(io.BytesIO(raw)).convert("RGB"))), _reference(raw))


@pytest.mark.parametrize("scaled_decode", [True, False])
def test_eval_pixels_match_resize_256_center_crop_224(photos, scaled_decode):
    loader = make_loader(
        photos, len(photos), crop=224, mode="eval", num_workers=0, scaled_decode=scaled_decode
    )
    x, y = next(iter(loader))
    assert (
        x.shape == (len(photos), 3, 224, 224) and x.dtype == torch.uint8 and y.tolist() == list(range(len(y)))
    )
    psnr = [_psnr(x[k].permute(1, 2, 0).numpy(), _reference(raw)) for k, (raw, _) in enumerate(photos)]
    assert min(psnr) >= PSNR_DB, f"PSNR per photo vs PIL + Resize(256) + CenterCrop(224): {np.round(psnr, 1)}"


def test_eval_geometry_is_torchvisions_exactly_with_the_pil_decoder(photos):
    # the pil backend is PIL's decode and PIL's bilinear resize, torchvision's own path: a difference is geometry
    x, _ = next(iter(make_loader(photos, len(photos), crop=224, mode="eval", num_workers=0, backend="pil")))
    for k, (raw, _) in enumerate(photos):
        np.testing.assert_array_equal(x[k].permute(1, 2, 0).numpy(), _reference(raw))


def test_eval_decodes_at_the_largest_dct_scale_keeping_the_short_side(photos, monkeypatch):
    chosen: list[int] = []
    real = decode.dct_scale

    def spy(crop_hw: tuple[int, int], target_hw: tuple[int, int] | None) -> int:
        chosen.append(real(crop_hw, target_hw))
        return chosen[-1]

    monkeypatch.setattr(decode, "dct_scale", spy)
    next(iter(make_loader(photos, len(photos), crop=224, mode="eval", num_workers=0, backend="simplejpeg")))
    want = [next((d for d in (8, 4, 2) if min(w, h) / d >= 256), 1) for w, h in SIZES]
    assert chosen == want == [8, 4, 4, 2, 4, 2, 1, 1, 1]


@pytest.mark.parametrize("workers", [0, 2])
def test_eval_gives_every_sample_once_in_order_unflipped(workers):
    g = torch.Generator().manual_seed(0)
    ds = [(torch.randint(0, 256, (3, 32, 24), dtype=torch.uint8, generator=g), i) for i in range(37)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PttWarning)  # nothing dropped: nothing to say
        loader = make_loader(ds, 8, crop=24, resize=24, mode="eval", num_workers=workers)
    assert loader.dropped_per_epoch == 0 and loader.mode == "eval" and len(loader) == 5
    epochs = [list(loader) for _ in range(2)]
    assert [x.shape[0] for x, _ in epochs[0]] == [8, 8, 8, 8, 5]  # the last batch is partial, not dropped
    assert [int(v) for _, y in epochs[0] for v in y] == list(range(37))
    for (xa, _), (xb, _) in zip(*epochs):
        assert torch.equal(xa, xb)  # no randomness left: each epoch is the same
    # short side already 24: no resize, the centre 24x24 is rows 4..27, never mirrored (noise: a flip shows)
    x = torch.cat([x for x, _ in epochs[0]])
    for k in range(37):
        assert torch.equal(x[k], ds[k][0][:, 4:28]), f"sample {k}"


def test_eval_ranks_share_the_samples_once():
    ds = [(torch.full((3, 8, 8), i, dtype=torch.uint8), i) for i in range(23)]
    seen = []
    for rank in range(3):
        loader = make_loader(ds, 4, crop=8, mode="eval", num_workers=0, rank=rank, world_size=3)
        seen += [int(v) for _, y in loader for v in y]
    assert sorted(seen) == list(range(23))


def test_eval_over_a_256_cache_is_an_exact_centre_crop(photos, tmp_path):
    cached = ptt.cache_in_ram(photos, size=256, cache_dir=str(tmp_path), num_workers=0)
    x, _ = next(iter(make_loader(cached, len(photos), crop=224, mode="eval", num_workers=0)))
    for k in range(len(photos) - 1):  # the last photo (300x200) is cached as it is: the cache never enlarges
        arr = cached.read_raw(k)[0]  # short side 256 already: the eval resize is a no-op
        assert min(arr.shape[:2]) == 256
        t, lf = round((arr.shape[0] - 224) / 2), round((arr.shape[1] - 224) / 2)
        np.testing.assert_array_equal(x[k].permute(1, 2, 0).numpy(), arr[t : t + 224, lf : lf + 224])


def test_eval_default_resize_is_crop_over_0875_and_mode_options_are_checked():
    ds = [(torch.zeros(3, 300, 400, dtype=torch.uint8), 0)]
    assert make_loader(ds, 1, mode="eval", num_workers=0).dataloader.dataset.maker.resize == 256
    assert (
        make_loader(ds, 1, crop=(160, 128), mode="eval", num_workers=0).dataloader.dataset.maker.resize == 183
    )
    with pytest.raises(PttError, match="'train' or 'eval'"):
        make_loader(ds, 1, mode="test")
    with pytest.raises(PttError, match="mode='eval'"):
        make_loader(ds, 1, resize=256)
    with pytest.raises(PttError, match="scale=/ratio="):
        make_loader(ds, 1, mode="eval", scale=(0.5, 1.0))
    with pytest.raises(PttError, match="resize >= crop"):
        make_loader(ds, 1, crop=224, resize=200, mode="eval")
