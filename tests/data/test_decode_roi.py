"""Region-of-interest JPEG decode: the window's pixels equal a whole-image decode's, at every DCT scale and
subsampling, on real photos; the window maths; the fallbacks (progressive, odd subsampling, colour space, corrupt,
no compiler) are taken and counted; the crop box distribution is torchvision's."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pytorchtricks.data import decode, decode_roi
from pytorchtricks.data.errors import DecodeError
from pytorchtricks.data.photoset import wallpaper_sources

TARGET = (224, 224)
# The loss of the decode path itself (DCT-scaled decode + one bilinear resize, vs a full-size decode + area resize):
# what the window adds to it is nothing (its pixels equal the whole-image decode's at the same scale, tested exactly)
PSNR_MIN_DB = 27.0
# Crop side lengths that make dct_scale pick each denominator for a 224 target (crop / d >= 224)
SIDE_FOR_SCALE = {8: 1800, 4: 900, 2: 460, 1: 300}
# Sampling factors we can encode: PIL (4:4:4, 4:2:2, 4:2:0, grey) and OpenCV (4:4:0, and 4:1:1 for the fallback)
SAMPLINGS = ("4:4:4", "4:2:2", "4:2:0", "4:4:0", "grey")


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    """A 2411x1901 region of a real wallpaper photo at native resolution (odd sizes: partial edge MCUs)."""
    from PIL import Image

    big = []
    for _, path in wallpaper_sources():
        with Image.open(path) as img:
            if img.size[0] >= 2411 and img.size[1] >= 1901:
                big.append(path)
    if not big:
        pytest.skip("no Debian wallpaper photo of >= 2411x1901 installed (make system-deps)")
    with Image.open(big[0]) as img:
        return np.asarray(img.convert("RGB").crop((0, 0, 2411, 1901)))


def _encode(arr: np.ndarray, sampling: str, *, progressive: bool = False) -> bytes:
    from PIL import Image

    if sampling in ("4:4:0", "4:1:1"):
        import cv2

        factor = {
            "4:4:0": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
            "4:1:1": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411,
        }
        flags = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor[sampling]]
        ok, enc = cv2.imencode(".jpg", np.ascontiguousarray(arr[:, :, ::-1]), flags)
        assert ok
        return enc.tobytes()
    buf = io.BytesIO()
    img = Image.fromarray(arr)
    if sampling == "grey":
        img.convert("L").save(buf, "JPEG", quality=90, progressive=progressive)
    elif sampling == "cmyk":
        img.convert("CMYK").save(buf, "JPEG", quality=90)
    else:
        sub = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}[sampling]
        img.save(buf, "JPEG", quality=90, subsampling=sub, progressive=progressive)
    return buf.getvalue()


def _boxes(h: int, w: int, side: int) -> list[tuple[int, int, int, int]]:
    """Crops of about ``side`` px: the four corners (edge MCUs, partial ones on the right and bottom), one starting
    on an iMCU boundary at every scale (a multiple of 128 px), one at odd offsets, a full-width band, a full-height
    column."""
    s = min(side, h, w)
    return [
        (0, 0, s, s),
        (0, w - s, s, s),
        (h - s, 0, s, s),
        (h - s, w - s, s, s),
        (128, 256, min(s - 5, h - 128), min(s, w - 256)),
        (37, 101, min(s - 3, h - 37), min(s - 7, w - 101)),
        (h // 3, 0, s // 2, w),
        (0, w // 2 - s // 4, h, s // 2),
    ]


def _psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def _needs_roi() -> None:
    if not decode.backend_works("roi"):
        pytest.skip(f"the JPEG window shim does not build here: {decode_roi.unavailable_reason()}")


# ---------------------------------------------------------------------------------------- window maths


def test_imcu_alignment_per_sampling_and_scale() -> None:
    # iMCU width = 8/d output pixels per block x the luma h sampling factor (1 for 4:4:4 and 4:4:0, 2 for 4:2:x)
    assert [decode_roi.imcu_align(2, d, False) for d in (1, 2, 4, 8)] == [16, 8, 4, 2]
    assert [decode_roi.imcu_align(1, d, False) for d in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert decode_roi.imcu_align(2, 1, True) == 8  # grey: one component, its own blocks
    for left in range(0, 70):
        x0, width = decode_roi.aligned_window(left, 10, 16)
        assert x0 % 16 == 0 and x0 <= left < x0 + 16 and x0 + width == left + 10


def test_scale_choice_keeps_the_crop_at_least_the_target() -> None:
    for d, side in SIDE_FOR_SCALE.items():
        assert decode.dct_scale((side, side), TARGET) == d
    assert decode.dct_scale((1792, 1792), TARGET) == 8 and decode.dct_scale((1791, 4000), TARGET) == 4
    assert decode.dct_scale((448, 5000), TARGET) == 2 and decode.dct_scale((447, 5000), TARGET) == 1
    assert decode.dct_scale((100, 100), TARGET) == 1 and decode.dct_scale((5000, 5000), None) == 1


def test_scaled_box_stays_inside_the_scaled_image_at_the_edges() -> None:
    h0, w0 = 1901, 2411
    for d in (1, 2, 4, 8):
        hs, ws = -(-h0 // d), -(-w0 // d)
        for box in [*_boxes(h0, w0, SIDE_FOR_SCALE[d]), (h0 - 1, w0 - 1, 1, 1), (0, 0, 1, 1)]:
            t, lf, b, r = decode._scaled_box(box, h0, w0, hs, ws)
            assert 0 <= t < b <= hs and 0 <= lf < r <= ws
            assert t <= box[0] / d and b >= (box[0] + box[2]) / d - 1e-9  # covers the crop


# ---------------------------------------------------------------------------------------- pixels


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_window_equals_whole_image_decode_at_every_scale(photo: np.ndarray, sampling: str) -> None:
    _needs_roi()
    data = _encode(photo, sampling)
    h, w = photo.shape[:2]
    before = decode.decode_stats()
    n, scales = 0, set()
    for side in SIDE_FOR_SCALE.values():
        for box in _boxes(h, w, side):
            d = decode.dct_scale((box[2], box[3]), TARGET)
            scales.add(d)
            got = decode.decode_image(data, size=TARGET, crop=box, backend="roi")
            want = decode.decode_image(data, size=TARGET, crop=box, backend="simplejpeg")
            np.testing.assert_array_equal(got, want, err_msg=f"{sampling} 1/{d} {box}")
            n += 1
    after = decode.decode_stats()
    assert scales == {1, 2, 4, 8}
    assert after["window"] - before["window"] == n  # every one went through the window, none fell back
    assert after["fallback"] == before["fallback"]


@pytest.mark.parametrize("sampling", ("4:2:0", "4:4:4"))
def test_window_psnr_vs_full_size_decode(photo: np.ndarray, sampling: str) -> None:
    """On the real photo, vs a full-size decode (Pillow) + the same crop + area resize: >= PSNR_MIN_DB per crop,
    at every scale."""
    import cv2
    from PIL import Image

    _needs_roi()
    data = _encode(photo, sampling)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    h, w = photo.shape[:2]
    for d, side in SIDE_FOR_SCALE.items():
        for t, lf, bh, bw in _boxes(h, w, side)[:6]:
            ref = cv2.resize(full[t : t + bh, lf : lf + bw], TARGET[::-1], interpolation=cv2.INTER_AREA)
            got = decode.decode_image(data, size=TARGET, crop=(t, lf, bh, bw), backend="roi")
            assert _psnr_db(got, ref) >= PSNR_MIN_DB, (sampling, d, (t, lf, bh, bw))


def test_window_without_a_target_is_the_exact_crop(photo: np.ndarray) -> None:
    _needs_roi()
    data = _encode(photo[:300, :400], "4:2:0")
    full = decode.decode_image(data, backend="simplejpeg")
    got = decode.decode_image(data, crop=(17, 33, 101, 203), backend="roi")
    np.testing.assert_array_equal(got, full[17:118, 33:236])


def test_decoded_pixels_fall_with_the_window(photo: np.ndarray) -> None:
    _needs_roi()
    data = _encode(photo, "4:2:0")
    box = (600, 800, 300, 300)  # 1/1 scale (300 < 448): the whole image would be 4.6 MP
    decode.reset_decode_stats()
    decode.decode_image(data, size=TARGET, crop=box, backend="roi")
    win_px = decode.decode_stats()["decoded_px"]
    decode.reset_decode_stats()
    decode.decode_image(data, size=TARGET, crop=box, backend="simplejpeg")
    assert decode.decode_stats()["decoded_px"] == 1901 * 2411
    assert 300 * 302 <= win_px <= 300 * (302 + decode_roi.MAX_ALIGN)  # the crop, its margin and iMCU widening


# ---------------------------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("progressive", "progressive"), ("4:1:1", "subsampling"), ("cmyk", "colour space")],
)
def test_fallbacks_decode_on_the_usual_path_and_count(photo: np.ndarray, kind: str, reason: str) -> None:
    _needs_roi()
    small = photo[:480, :640]
    data = _encode(small, "4:2:0", progressive=True) if kind == "progressive" else _encode(small, kind)
    with pytest.raises(decode_roi.Refused) as info:
        decode_roi.decode_window(data, 1, 10, 50, 20, 90)
    assert info.value.reason == reason
    decode.reset_decode_stats()
    box = (40, 60, 200, 300)
    got = decode.decode_image(data, size=(112, 112), crop=box, backend="roi")
    want = decode.decode_image(data, size=(112, 112), crop=box, backend=decode.fallback_backend())
    np.testing.assert_array_equal(got, want)
    stats = decode.decode_stats()
    assert stats["fallback"] == {reason: 1} and stats["window"] == 0


def test_corrupt_jpeg_falls_back_and_raises_decode_error(photo: np.ndarray) -> None:
    _needs_roi()
    data = _encode(photo[:480, :640], "4:2:0")
    decode.reset_decode_stats()
    with pytest.raises(DecodeError):  # truncated: libjpeg warns (premature end); the strict path then refuses
        decode.decode_image(data[: len(data) // 2], size=(64, 64), crop=(300, 0, 150, 150), backend="roi")
    assert decode.decode_stats()["fallback"] == {"corrupt": 1}
    with pytest.raises(decode_roi.Refused, match="window"):
        decode_roi.decode_window(data, 1, 0, 10, 600, 700)  # outside the 640 columns


def test_whole_image_decode_is_not_a_window(photo: np.ndarray) -> None:
    _needs_roi()
    data = _encode(photo[:480, :640], "4:2:0")
    decode.reset_decode_stats()
    np.testing.assert_array_equal(
        decode.decode_image(data, size=(120, 160), backend="roi"),
        decode.decode_image(data, size=(120, 160), backend="simplejpeg"),
    )
    assert decode.decode_stats()["window"] == 0 and decode.decode_stats()["fallback"] == {}


def test_no_compiler_falls_back_counted(
    photo: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _encode(photo[:480, :640], "4:2:0")
    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    decode_roi.reset()
    try:
        assert decode_roi.window_decoder() is None
        assert "no-such-cc" in decode_roi.unavailable_reason() or "compil" in decode_roi.unavailable_reason()
        decode.reset_decode_stats()
        got = decode.decode_image(data, size=(64, 64), crop=(100, 100, 200, 200), backend="roi")
        want = decode.decode_image(data, size=(64, 64), crop=(100, 100, 200, 200), backend="simplejpeg")
        np.testing.assert_array_equal(got, want)
        assert decode.decode_stats()["fallback"] == {"unavailable": 1}
    finally:
        decode_roi.reset()


def test_build_is_atomic_and_shared_by_concurrent_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_threads: Any
) -> None:
    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path))
    path = decode_roi.library_path()
    assert path.startswith(str(tmp_path))
    errors = run_threads(lambda: decode_roi.build(path), 3)
    if errors and "compil" in str(errors[0]):
        pytest.skip(f"no C compiler / libjpeg headers here: {errors[0]}")
    assert not errors
    folder = Path(path).parent
    assert sorted(p.name for p in folder.iterdir()) == sorted([Path(path).name, Path(path).name + ".lock"])
    decode_roi.reset()
    try:
        assert decode_roi.window_decoder() is not None and decode_roi.unavailable_reason() == ""
    finally:
        decode_roi.reset()


# ---------------------------------------------------------------------------------------- crop boxes


def _ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


@pytest.mark.parametrize("hw", [(1901, 2411), (375, 500), (3000, 1000)])
def test_crop_box_distribution_is_torchvisions(hw: tuple[int, int]) -> None:
    """10,000 boxes of the loader's RandomResizedCrop vs torchvision's ``get_params``: area fraction, log aspect,
    and relative centre, each by a two-sample Kolmogorov-Smirnov test at alpha = 1e-4 (4 statistics x 3 sizes:
    a false alarm in at most 0.12% of seeds)."""
    from torchvision.transforms import RandomResizedCrop

    from pytorchtricks.data.images import rrc_box

    h, w = hw
    n, scale, ratio = 10_000, (0.08, 1.0), (3 / 4, 4 / 3)
    rng = np.random.default_rng(0)
    ours = np.array([rrc_box(h, w, scale, ratio, rng) for _ in range(n)], dtype=np.float64)
    torch.manual_seed(0)
    img = torch.empty(3, h, w)
    theirs = np.array(
        [RandomResizedCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)], np.float64
    )

    def stats(b: np.ndarray) -> list[np.ndarray]:
        t, lf, bh, bw = b.T
        return [bh * bw / (h * w), np.log(bw / bh), (t + bh / 2) / h, (lf + bw / 2) / w]

    critical = math.sqrt(-math.log(1e-4 / 2) / 2) * math.sqrt(2 / n)
    for name, a, b in zip(("area", "log aspect", "centre y", "centre x"), stats(ours), stats(theirs)):
        assert _ks_statistic(a, b) < critical, name


def test_loader_batches_identical_with_and_without_the_window(photo: np.ndarray) -> None:
    """make_loader through the window path gives the same batches as through the whole-image path (same boxes,
    same flips, same pixels): the window changes what is decoded, not what comes out."""
    from pytorchtricks.tricks.data.make_loader import make_loader

    _needs_roi()
    data = [(_encode(photo[: 1901 - 97 * k, : 2411 - 131 * k], "4:2:0"), k % 2) for k in range(8)]
    decode.reset_decode_stats()
    a = list(make_loader(data, 4, num_workers=0, seed=3, backend="roi"))
    assert decode.decode_stats()["window"] > 0
    b = list(make_loader(data, 4, num_workers=0, seed=3, backend="simplejpeg"))
    assert len(a) == len(b) == 2
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_folder_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path))
    folder = Path(decode_roi.library_path()).parent
    folder.mkdir(parents=True)
    folder.chmod(0o777)  # world-writable: someone else could plant the library
    decode_roi.reset()
    try:
        assert decode_roi.window_decoder() is None
        assert "not private" in decode_roi.unavailable_reason()
    finally:
        decode_roi.reset()
