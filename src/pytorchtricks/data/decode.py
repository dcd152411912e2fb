"""Image decoding with DCT-domain downscaling: decode a JPEG at 1/2, 1/4 or 1/8 size when the target allows it.

A JPEG stores 8x8 DCT blocks; libjpeg can reconstruct them at 1/2, 1/4 or 1/8 resolution by using only the low
frequencies, which skips most of the inverse DCT and colour conversion. When the caller knows the output size (and
the crop, for RandomResizedCrop), the largest scale whose scaled crop is still at least the target loses nothing
visible and decodes several times faster. Backends: ``roi`` (the default where it works: a crop that is a real
sub-window decodes only that window's rows and iMCU columns at the scale, through ``data.decode_roi``; progressive
JPEGs, other subsamplings and colour spaces, and whole-image decodes go to the next backend), ``simplejpeg`` and
``opencv`` (libjpeg-turbo), ``pil-draft`` (Pillow's ``Image.draft``), ``turbojpeg`` (PyTurboJPEG, when importable)
and plain ``pil`` (full decode, the reference). Non-JPEG inputs (PNG, WebP, ...) go through Pillow at full size.
``decode_stats()`` counts, per process, the window decodes, the fallbacks by reason and the pixels decoded.
"""

from __future__ import annotations

import functools
import io
import math
import warnings
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from pytorchtricks.core import PttError, PttWarning
from pytorchtricks.data import decode_roi
from pytorchtricks.data.errors import DecodeError

Box = tuple[int, int, int, int]  # (top, left, height, width) in original-image pixels
BACKENDS: tuple[str, ...] = ("roi", "simplejpeg", "turbojpeg", "opencv", "pil-draft", "pil")
# Per process (each DataLoader worker has its own): decodes, window decodes, fallbacks by reason, pixels decoded
_STATS: dict[str, Any] = {"images": 0, "window": 0, "planes": 0, "decoded_px": 0, "fallback": {}}


def decode_stats() -> dict[str, Any]:
    """What this process decoded so far: ``images``, ``window`` (decoded as a window), ``planes`` (decoded to
    Y/Cb/Cr planes and resampled before the colour conversion: ``decode_planes``), ``fallback`` (reason ->
    count: ``progressive``, ``subsampling``, ``colour space``, ``corrupt``, ``unavailable``, ``planes``), ``decoded_px``
    (pixels that left the IDCT: the window at its DCT scale, or the whole scaled image) - a copy.

    Example:
        >>> before = decode_stats()["images"]
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (64, 48)).save(buf, "JPEG")
        >>> _ = decode_image(buf.getvalue(), size=(8, 8), crop=(0, 0, 16, 16))
        >>> decode_stats()["images"] - before
        1
    """
    return {**_STATS, "fallback": dict(_STATS["fallback"])}


def decoded_since(before: dict[str, Any]) -> dict[str, Any]:
    """What this process decoded since ``before = decode_stats()``: ``images``, ``px`` (pixels out of the IDCT),
    ``window`` and ``fallback`` (reason -> count, the reasons that occurred)."""
    after = decode_stats()
    fb = {k: v - before["fallback"].get(k, 0) for k, v in after["fallback"].items()}
    return {
        "images": after["images"] - before["images"],
        "px": after["decoded_px"] - before["decoded_px"],
        "window": after["window"] - before["window"],
        "fallback": {k: v for k, v in fb.items() if v > 0},
    }


def reset_decode_stats() -> None:
    """Zero the counters of ``decode_stats``."""
    _STATS.update(images=0, window=0, planes=0, decoded_px=0, fallback={})


def _count(px: int) -> None:
    _STATS["decoded_px"] += px


def _count_fallback(reason: str) -> None:
    fb = _STATS["fallback"]
    fb[reason] = fb.get(reason, 0) + 1


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _as_buffer(data: Any) -> Any:
    if isinstance(data, bytes | bytearray | memoryview):
        return data
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise PttError(f"decode_image needs encoded bytes as a uint8 array, got dtype {data.dtype}.")
        return memoryview(np.ascontiguousarray(data).reshape(-1))  # type: ignore[arg-type]
    raise PttError(f"decode_image needs bytes, memoryview or a uint8 numpy array, got {type(data).__name__}.")


def is_jpeg(data: Any) -> bool:
    buf = _as_buffer(data)
    return len(buf) >= 3 and bytes(buf[:3]) == b"\xff\xd8\xff"


def image_size(data: bytes | memoryview | np.ndarray) -> tuple[int, int]:
    """``(height, width)`` read from the JPEG/PNG header without decoding (other formats: Pillow's lazy open).

    Example:
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (40, 30)).save(buf, "JPEG")
        >>> ptt.image_size(buf.getvalue())
        (30, 40)
    """
    buf = _as_buffer(data)
    if is_jpeg(buf):
        return _jpeg_size(bytes(buf[: min(len(buf), 1 << 20)]) if len(buf) > 1 << 20 else bytes(buf))
    head = bytes(buf[:24])
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24 and head[12:16] == b"IHDR":
        return int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")
    try:
        from PIL import Image

        w, h = Image.open(io.BytesIO(bytes(buf))).size
    except Exception as exc:
        raise DecodeError(f"not a readable image ({len(buf)} bytes): {exc}") from exc
    return h, w


def _jpeg_size(b: bytes) -> tuple[int, int]:
    i, n = 2, len(b)
    while i + 4 <= n:
        if b[i] != 0xFF:
            raise DecodeError(f"corrupt JPEG header at byte {i} (no marker)")
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01,) or 0xD0 <= marker <= 0xD9:  # standalone markers carry no length
            i += 2
            continue
        seg = int.from_bytes(b[i + 2 : i + 4], "big")
        if seg < 2:
            raise DecodeError(f"corrupt JPEG header at byte {i} (segment length {seg})")
        if marker in _SOF:
            if i + 9 > n:
                break
            h, w = int.from_bytes(b[i + 5 : i + 7], "big"), int.from_bytes(b[i + 7 : i + 9], "big")
            if h == 0 or w == 0:
                raise DecodeError("JPEG header has a zero dimension")
            return h, w
        i += 2 + seg
    raise DecodeError(f"truncated JPEG header ({n} bytes): no frame (SOF) marker found")


# ------------------------------------------------------------------------------------------- planning


def short_side_hw(
    h: int,
    w: int,
    size: int | None,
    *,
    max_size: int | None = None,
    enlarge: bool,
    rounding: Literal["round", "floor"],
    scale_first: bool,
) -> tuple[int, int]:
    """The ``(height, width)`` an ``h`` x ``w`` image is resized to when its short side becomes ``size`` (the one
    short-side rule; every caller names the parts its arithmetic must keep).

    The ratio is ``min(size / short, max_size / long)`` (``size`` None: only ``max_size`` bounds it; both None:
    unchanged). ``enlarge=False`` never scales up: a ratio >= 1 returns ``(h, w)`` unchanged. ``rounding``:
    ``"round"`` (Python's, half to even) or ``"floor"`` (torchvision's ``int(side * r)``). ``scale_first``:
    ``side * (size / short)``, one float scale for both sides (torchvision's RandomShortestSize, a pack, the RAM
    cache), or ``side * size / short`` (False: the exact ratio rounded once, torchvision's ``Resize`` and the
    decoder's int ``size``); the two differ where a side lands on a half pixel (``147 * 1 / 98 = 1.5`` exactly,
    ``147 * (1 / 98) = 1.4999999999999998``). Each side is at least 1.

    Example:
        >>> short_side_hw(480, 640, 256, enlarge=False, rounding="round", scale_first=True)
        (256, 341)
        >>> short_side_hw(480, 640, 800, max_size=1000, enlarge=True, rounding="floor", scale_first=True)
        (750, 1000)
        >>> [short_side_hw(98, 147, 1, enlarge=True, rounding="round", scale_first=f)[1] for f in (True, False)]
        [1, 2]
    """
    ratios = [(n, d) for n, d in ((size, min(h, w)), (max_size, max(h, w))) if n is not None]
    if not ratios:
        return h, w
    num, den = min(ratios, key=lambda nd: nd[0] / nd[1])  # a tie keeps the short side's ratio
    scale = num / den
    if scale >= 1 and not enlarge:
        return h, w
    rnd = round if rounding == "round" else math.floor

    def side(x: int) -> int:
        return max(1, rnd(x * scale if scale_first else x * num / den))

    return side(h), side(w)


def _target(size: int | tuple[int, int] | None, ch: int, cw: int) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int | np.integer):
        if size <= 0:
            raise PttError(f"size must be positive, got {size}.")
        return short_side_hw(ch, cw, int(size), enlarge=True, rounding="round", scale_first=False)
    if len(size) != 2 or min(size) <= 0:
        raise PttError(f"size must be an int (short side) or (height, width) > 0, got {size!r}.")
    return int(size[0]), int(size[1])


def _crop_box(crop: Box | None, h0: int, w0: int) -> Box:
    if crop is None:
        return 0, 0, h0, w0
    t, lf, h, w = (int(v) for v in crop)
    if h <= 0 or w <= 0 or t < 0 or lf < 0 or t + h > h0 or lf + w > w0:
        raise PttError(
            f"crop {crop} (top, left, height, width) lies outside the {h0}x{w0} image; clip it to the image."
        )
    return t, lf, h, w


def dct_scale(crop_hw: tuple[int, int], target_hw: tuple[int, int] | None) -> int:
    """Largest denominator d in (8, 4, 2, 1) with crop/d still >= target on both sides.

    Example:
        >>> dct_scale((1000, 800), (224, 224)), dct_scale((300, 300), (224, 224)), dct_scale((64, 64), None)
        (2, 1, 1)
    """
    if target_hw is None:
        return 1
    for d in (8, 4, 2):
        if crop_hw[0] / d >= target_hw[0] and crop_hw[1] / d >= target_hw[1]:
            return d
    return 1


def _scaled_box(box: Box, h0: int, w0: int, hs: int, ws: int) -> tuple[int, int, int, int]:
    """The crop in the coordinates of a decoded image of size (hs, ws): (top, left, bottom, right)."""
    fy, fx = hs / h0, ws / w0
    t, lf = int(box[0] * fy), int(box[1] * fx)
    b = min(hs, max(t + 1, math.ceil((box[0] + box[2]) * fy)))
    r = min(ws, max(lf + 1, math.ceil((box[1] + box[3]) * fx)))
    return t, lf, b, r


def resize_array(
    arr: np.ndarray, hw: tuple[int, int], *, area: bool | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Resize HWC uint8 to ``hw``: the one resize policy of the decoders, the loaders, the cache and pack.

    ``area=None``: area averaging when shrinking by 2x or more on both sides, else bilinear (after a DCT-scaled
    decode the remaining factor is below 2, where OpenCV's area filter costs ~10x bilinear for little gain);
    ``area=True`` averages whenever it shrinks (pack time, where quality beats speed); ``area=False`` is always
    bilinear. Without OpenCV, Pillow's bilinear. Written into ``out`` (a slot of a batch buffer: no extra copy)
    when given; otherwise a C-contiguous array (``arr`` itself when it already is one of size ``hw``).

    Example:
        >>> resize_array(np.zeros((48, 64, 3), np.uint8), (24, 32)).shape
        (24, 32, 3)
    """
    if arr.shape[0] == hw[0] and arr.shape[1] == hw[1]:
        if out is None:
            return np.ascontiguousarray(arr)
        out[...] = arr
        return out
    try:
        import cv2
    except ImportError:
        from PIL import Image

        res = np.asarray(
            Image.fromarray(np.ascontiguousarray(arr)).resize((hw[1], hw[0]), Image.Resampling.BILINEAR)
        )
        if out is None:
            return res
        out[...] = res
        return out
    shrink = min(arr.shape[0] / hw[0], arr.shape[1] / hw[1])
    use_area = shrink >= 2 if area is None else (area and shrink > 1)
    mode = cv2.INTER_AREA if use_area else cv2.INTER_LINEAR
    if out is not None:
        cv2.resize(arr, (hw[1], hw[0]), dst=out, interpolation=mode)
        return out
    return cv2.resize(arr, (hw[1], hw[0]), interpolation=mode)


def _finish(arr: np.ndarray, box: Box, h0: int, w0: int, target: tuple[int, int] | None) -> np.ndarray:
    t, lf, b, r = _scaled_box(box, h0, w0, arr.shape[0], arr.shape[1])
    if (t, lf, b, r) != (0, 0, arr.shape[0], arr.shape[1]):
        arr = arr[t:b, lf:r]
    if target is None:
        target = (box[2], box[3])
    return resize_array(arr, target)


# ------------------------------------------------------------------------------------------- backends


def _pil(buf: Any, box: Box | None, target: tuple[int, int] | None, draft: bool) -> np.ndarray:
    from PIL import Image

    img: Any = Image.open(io.BytesIO(buf))
    w0, h0 = img.size
    bx = _crop_box(box, h0, w0)
    if draft and img.format == "JPEG" and target is not None:
        d = dct_scale((bx[2], bx[3]), target)
        if d > 1:
            img.draft("RGB", (w0 // d, h0 // d))  # Pillow picks scale = min(w0 // w, h0 // h)
    if img.mode != "RGB":
        img = img.convert("RGB")
    ws, hs = img.size
    _count(hs * ws)
    t, lf, b, r = _scaled_box(bx, h0, w0, hs, ws)
    out_hw = target or (bx[2], bx[3])
    if (t, lf, b, r) == (0, 0, hs, ws) and (hs, ws) == out_hw:
        return np.asarray(img)
    return np.asarray(img.resize((out_hw[1], out_hw[0]), Image.Resampling.BILINEAR, box=(lf, t, r, b)))


def _simplejpeg(buf: Any, box: Box | None, target: tuple[int, int] | None) -> np.ndarray:
    import simplejpeg

    h0, w0, _, _ = simplejpeg.decode_jpeg_header(buf)
    bx = _crop_box(box, h0, w0)
    if target is None:
        arr = simplejpeg.decode_jpeg(buf, colorspace="RGB")
    else:  # ask for exactly 1/d: left free, libjpeg picks M/8 factors like 3/8 whose IDCT has no SIMD (slower)
        d = dct_scale((bx[2], bx[3]), target)
        mh, mw = math.ceil(h0 / d), math.ceil(w0 / d)
        arr = simplejpeg.decode_jpeg(buf, colorspace="RGB", min_height=mh, min_width=mw)
    _count(arr.shape[0] * arr.shape[1])
    return _finish(arr, bx, h0, w0, target)


def _opencv(buf: Any, box: Box | None, target: tuple[int, int] | None) -> np.ndarray:
    import cv2

    h0, w0 = image_size(buf)
    bx = _crop_box(box, h0, w0)
    d = dct_scale((bx[2], bx[3]), target) if is_jpeg(buf) else 1
    flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4}.get(
        d, cv2.IMREAD_REDUCED_COLOR_8
    )
    bgr = cv2.imdecode(np.frombuffer(buf, np.uint8), flag | cv2.IMREAD_IGNORE_ORIENTATION)
    if bgr is None:
        raise DecodeError("opencv could not decode the image")
    _count(bgr.shape[0] * bgr.shape[1])
    return _finish(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), bx, h0, w0, target)


def _turbojpeg(buf: Any, box: Box | None, target: tuple[int, int] | None) -> np.ndarray:
    tj = _turbo_handle()
    h0, w0 = image_size(buf)
    bx = _crop_box(box, h0, w0)
    d = dct_scale((bx[2], bx[3]), target)
    mod = _turbo_module()
    arr = tj.decode(bytes(buf), pixel_format=mod.TJPF_RGB, scaling_factor=(1, d))
    _count(arr.shape[0] * arr.shape[1])
    return _finish(arr, bx, h0, w0, target)


def _roi(buf: Any, box: Box | None, target: tuple[int, int] | None) -> np.ndarray:
    """Decode only the crop's window at the DCT scale; what the window path refuses goes to ``fallback_backend``.

    The window asked of libjpeg reaches one pixel past the crop on each side (inside the image): with 4:2:2/4:2:0
    chroma, the upsampler treats the window's edge columns as image edges (replicated chroma), so the margin keeps
    the crop's own pixels identical to a full decode at the same scale.
    """
    fallback = _IMPL[fallback_backend()]
    h0, w0 = image_size(buf)
    bx = _crop_box(box, h0, w0)
    d = dct_scale((bx[2], bx[3]), target)
    hs, ws = -(-h0 // d), -(-w0 // d)  # libjpeg's scaled size: ceil(size / d)
    t, lf, b, r = _scaled_box(bx, h0, w0, hs, ws)
    if (t, lf, b, r) == (0, 0, hs, ws):  # the whole image: nothing to skip
        return fallback(buf, box, target)
    try:
        win = decode_roi.decode_window(buf, d, t, b, max(0, lf - 1), min(ws, r + 1))
    except decode_roi.Refused as exc:
        _count_fallback(exc.reason)
        return fallback(buf, box, target)
    except OSError:
        _count_fallback("unavailable")
        return fallback(buf, box, target)
    _STATS["window"] += 1
    _count(win.pixels.shape[0] * win.pixels.shape[1])
    arr = win.pixels[:, lf - win.x0 : r - win.x0]
    return resize_array(arr, target or (bx[2], bx[3]))


@functools.lru_cache(maxsize=1)
def _turbo_module() -> Any:
    import turbojpeg

    return turbojpeg


@functools.lru_cache(maxsize=1)
def _turbo_handle() -> Any:
    return _turbo_module().TurboJPEG()


_IMPL: dict[str, Callable[[Any, Box | None, tuple[int, int] | None], np.ndarray]] = {
    "roi": _roi,
    "simplejpeg": _simplejpeg,
    "turbojpeg": _turbojpeg,
    "opencv": _opencv,
    "pil-draft": lambda b, c, t: _pil(b, c, t, draft=True),
    "pil": lambda b, c, t: _pil(b, c, t, draft=False),
}


@functools.cache
def backend_works(name: str) -> bool:
    """True when ``name`` imports and decodes a small JPEG correctly in this process (probed once)."""
    if name not in _IMPL:
        return False
    if name == "roi":  # the shim builds and decodes a window, and there is a backend for what it refuses
        return decode_roi.works() and _fallback_or_none() is not None
    try:
        from PIL import Image

        ramp = np.linspace(0, 255, 48 * 64 * 3).astype(np.uint8).reshape(48, 64, 3)
        out = io.BytesIO()
        Image.fromarray(ramp).save(out, "JPEG", quality=95)
        got = _IMPL[name](out.getvalue(), None, (24, 32))
        return got.shape == (24, 32, 3) and got.dtype == np.uint8
    except Exception:
        return False


def available_backends() -> list[str]:
    """Backends that work here, fastest first (the first is what ``backend="auto"`` uses).

    Example:
        >>> from pytorchtricks.data.decode import available_backends
        >>> "pil" in available_backends()
        True
    """
    return [b for b in BACKENDS if backend_works(b)]


@functools.lru_cache(maxsize=1)
def _fallback_or_none() -> str | None:
    return next((b for b in BACKENDS if b != "roi" and backend_works(b)), None)


def fallback_backend() -> str:
    """The backend that decodes what ``roi`` does not (whole images, progressive, ...): the fastest other one."""
    name = _fallback_or_none()
    if name is None:
        raise PttError("no image decoder works: install Pillow (`pip install 'pytorchtricks[data]'`).")
    return name


@functools.lru_cache(maxsize=1)
def auto_backend() -> str:
    found = available_backends()
    if not found:
        raise PttError("no image decoder works: install Pillow (`pip install 'pytorchtricks[data]'`).")
    if found[0] != "roi":  # said once per process; the decode itself goes on, on the whole-image path
        why = decode_roi.unavailable_reason() or "it failed its probe"
        warnings.warn(
            f"the region-of-interest JPEG decode is off here ({why}); crops decode the whole image with {found[0]}.",
            PttWarning,
            stacklevel=3,
        )
    return found[0]


def decode_image(
    data: bytes | memoryview | np.ndarray,
    *,
    size: int | tuple[int, int] | None = None,
    crop: Box | None = None,
    backend: str = "auto",
) -> np.ndarray:
    """Decode an image to an HxWx3 uint8 RGB array, cropping and resizing with a DCT-scaled JPEG decode.

    Args:
        data: encoded bytes (JPEG fast paths; PNG and other formats via Pillow).
        size: output size after crop and resize: ``(height, width)``, or an int for the short side.
        crop: ``(top, left, height, width)`` in ORIGINAL image pixels, applied before the resize.
        backend: ``auto`` (probed once per process: ``roi`` where the window shim builds), or one of roi,
            simplejpeg, turbojpeg, opencv, pil-draft, pil.

    Returns:
        A C-contiguous ``uint8`` array of shape ``(H, W, 3)``.

    Raises:
        DecodeError: the bytes are not a decodable image. PttError: bad ``crop``/``size``/``backend``.

    Example:
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (640, 480), (200, 10, 10)).save(buf, "JPEG")
        >>> ptt.decode_image(buf.getvalue(), size=(112, 112), crop=(0, 0, 480, 480)).shape
        (112, 112, 3)
    """
    buf = _as_buffer(data)
    name = auto_backend() if backend == "auto" else backend
    if name not in _IMPL:
        raise PttError(f"unknown decode backend {backend!r}; use auto or one of {', '.join(BACKENDS)}.")
    _STATS["images"] += 1
    if not is_jpeg(buf) and name in ("roi", "simplejpeg", "turbojpeg", "pil-draft"):
        name = "pil"  # DCT scaling is JPEG-only; Pillow reads the rest
    target = None
    if size is not None:
        if crop is not None:
            target = _target(size, int(crop[2]), int(crop[3]))
        else:
            h0, w0 = image_size(buf)
            target = _target(size, h0, w0)
    try:
        return _IMPL[name](buf, crop, target)
    except PttError:
        raise
    except Exception as exc:
        raise DecodeError(f"cannot decode image ({len(buf)} bytes) with {name}: {exc}") from exc


# ------------------------------------------------------------------------------ scaled region (geometry plans)


def decode_scaled(
    data: bytes | memoryview | np.ndarray,
    denom: int,
    box: tuple[float, float, float, float] | None = None,
    *,
    backend: str = "auto",
) -> tuple[np.ndarray, int, int, int]:
    """The image decoded on the 1/``denom`` DCT grid, without any resize: ``(pixels, top, left, denom)``.

    Scaled pixel ``j`` covers original pixels ``[j * denom, (j + 1) * denom)``; ``pixels[0, 0]`` is scaled pixel
    ``(top, left)``. With ``box`` (``top, left, height, width`` in original pixels, fractional allowed) only the
    rows and iMCU columns holding it, plus one scaled pixel of margin for interpolation, are decoded (the window
    path of ``data.decode_roi``); what it refuses decodes the whole image at the scale. Non-JPEG input (no DCT
    scaling) is decoded at full size and averaged down to the same grid. This is the decode a geometry plan (``data.geometry``) warps from:
    one resample from the DCT grid to the output, whatever the crop, pad, flip or scale.

    Example:
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (640, 480)).save(buf, "JPEG")
        >>> px, top, left, d = decode_scaled(buf.getvalue(), 4, (100, 200, 80, 120))
        >>> d, top <= 25, px.shape[0] >= 20
        (4, True, True)
    """
    buf = _as_buffer(data)
    if denom not in (1, 2, 4, 8):
        raise PttError(f"denom must be 1, 2, 4 or 8, got {denom}.")
    name = auto_backend() if backend == "auto" else backend
    if name not in _IMPL:
        raise PttError(f"unknown decode backend {backend!r}; use auto or one of {', '.join(BACKENDS)}.")
    _STATS["images"] += 1
    try:
        h0, w0 = image_size(buf)
        hs, ws = -(-h0 // denom), -(-w0 // denom)
        if not is_jpeg(
            buf
        ):  # no DCT: decode whole, then average down to the grid (the resample after it < 2x)
            arr = _IMPL["pil"](buf, None, None)
            return (resize_array(arr, (hs, ws), area=True), 0, 0, denom) if denom > 1 else (arr, 0, 0, 1)
        if box is not None and name == "roi":
            t = max(0, math.floor(box[0] / denom) - 1)
            lf = max(0, math.floor(box[1] / denom) - 1)
            b = min(hs, math.ceil((box[0] + box[2]) / denom) + 1)
            r = min(ws, math.ceil((box[1] + box[3]) / denom) + 1)
            if b > t and r > lf and (t, lf, b, r) != (0, 0, hs, ws):
                try:
                    win = decode_roi.decode_window(buf, denom, t, b, lf, r)
                    _STATS["window"] += 1
                    _count(win.pixels.shape[0] * win.pixels.shape[1])
                    return win.pixels, t, win.x0, denom
                except decode_roi.Refused as exc:
                    _count_fallback(exc.reason)
                except OSError:
                    _count_fallback("unavailable")
        whole = fallback_backend() if name == "roi" else name
        if denom > 1 and whole == "pil":  # no DCT scaling there: decode whole, then average down to the grid
            arr = resize_array(_IMPL["pil"](buf, None, None), (hs, ws), area=True)
            return arr, 0, 0, denom
        arr = _whole_at_scale(buf, denom, whole) if denom > 1 else _IMPL[whole](buf, None, None)
        _count(arr.shape[0] * arr.shape[1])
        return arr, 0, 0, denom
    except PttError:
        raise
    except Exception as exc:
        raise DecodeError(f"cannot decode image ({len(buf)} bytes) with {name}: {exc}") from exc


def decode_planes(
    data: bytes | memoryview | np.ndarray, denom: int, *, backend: str = "auto"
) -> tuple[list[np.ndarray], int] | None:
    """The whole JPEG on the 1/``denom`` DCT grid as its component planes, not converted to RGB:
    ``(planes, subsampling)`` (``data.decode_yuv``: resample the planes, then ``decode_yuv.planes_to_rgb`` on the
    output's pixels). None where that path does not apply - not a JPEG, a ``backend`` other than ``auto``, no
    libturbojpeg, or a file TurboJPEG reports damaged - and the caller decodes to RGB (``decode_scaled``), which
    reports a bad file as it always has.

    Example:
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (640, 480)).save(buf, "JPEG")
        >>> got = decode_planes(buf.getvalue(), 2)
        >>> got is None or [p.shape for p in got[0]] == [(240, 320), (120, 160), (120, 160)]
        True
    """
    from pytorchtricks.data import decode_yuv

    buf = _as_buffer(data)
    if denom not in (1, 2, 4, 8):
        raise PttError(f"denom must be 1, 2, 4 or 8, got {denom}.")
    if backend != "auto" or not is_jpeg(buf) or not decode_yuv.available():
        return None
    try:
        planes, sub = decode_yuv.decode_planes(buf, denom)
    except decode_yuv.YuvRefused:
        _count_fallback("planes")  # the RGB decode that follows reports a damaged file
        return None
    _STATS["images"] += 1
    _STATS["planes"] += 1
    _count(planes[0].size)
    return planes, sub


def _whole_at_scale(buf: Any, denom: int, name: str) -> np.ndarray:
    """The whole JPEG at exactly 1/``denom`` (``ceil(size / denom)``, libjpeg's scaled IDCT), no resize after it."""
    h0, w0 = image_size(buf)
    hs, ws = -(-h0 // denom), -(-w0 // denom)
    if name == "simplejpeg":
        import simplejpeg

        return simplejpeg.decode_jpeg(buf, colorspace="RGB", min_height=hs, min_width=ws)
    if name == "turbojpeg":
        return _turbo_handle().decode(
            bytes(buf), pixel_format=_turbo_module().TJPF_RGB, scaling_factor=(1, denom)
        )
    if name == "opencv":
        import cv2

        flag = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}[
            denom
        ]
        bgr = cv2.imdecode(np.frombuffer(buf, np.uint8), flag | cv2.IMREAD_IGNORE_ORIENTATION)
        if bgr is None:
            raise DecodeError("opencv could not decode the image")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    from PIL import Image

    img: Any = Image.open(io.BytesIO(buf))
    img.draft("RGB", (ws, hs))  # Pillow picks the largest scale that keeps at least this size: 1/denom
    img = img.convert("RGB") if img.mode != "RGB" else img
    arr = np.asarray(img)
    if arr.shape[:2] != (hs, ws):  # plain "pil" has no DCT scaling: average down to the grid
        arr = resize_array(arr, (hs, ws), area=True)
    return arr
