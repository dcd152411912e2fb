"""Planar JPEG decode for resampling: the Y, Cb and Cr planes at a DCT scale, resampled, and only then made RGB.

A JPEG stores luma at full size and (usually) chroma at half size in each direction (4:2:0). Decoding to RGB
upsamples the chroma and converts every pixel of the decoded grid to RGB - about a sixth of the decode's time on
the 2-24 MP photos (measured on a 2-core AMD EPYC: 14.4 ms per photo to planes vs 17.2 ms to RGB at the same 1/2
or 1/4 scale) - and a shrinking resample then reads all three channels of that grid. Here each plane is resampled
straight to the output's size instead (the chroma planes by the scale factors times their subsampling: a chroma
sample covers that many luma pixels), and libjpeg-turbo's colour conversion (``tjDecodeYUVPlanes`` as 4:4:4: the
JFIF YCbCr -> RGB of its decoder, SIMD) runs on the output's pixels only, written straight into the caller's
buffer (a batch slot, with its row pitch).

Pixels differ from "decode to RGB, then resample" where the chroma is interpolated: libjpeg upsamples chroma in
the DCT at the smaller scales and by its triangle filter otherwise; here it is one bilinear resample from the
stored chroma samples. Measured on the 2-24 MP photos: >= 48 dB PSNR against the RGB path; on the tests' 1200 px
photos >= 37 dB against torchvision's full decode + resize, where the RGB path gets >= 38 dB (the tests bound it:
``tests/data/test_decode_yuv.py``). A greyscale JPEG comes out bit-identical.

TurboJPEG (``libturbojpeg``, the Debian package ``libturbojpeg0``) is loaded with ctypes on first use, one handle per
process and thread. Without it ``available()`` is False and callers take the RGB path. Decode errors and libjpeg's
warnings (a truncated or damaged file) raise ``YuvRefused``: the caller then decodes the RGB way, which reports
the file as it always has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Any

import numpy as np

TJPF_RGB = 0
TJSAMP_444, TJSAMP_GRAY = 0, 3
TJCS_YCBCR, TJCS_GRAY = 1, 2
# TJSAMP code -> (rows, columns) of luma per chroma sample
SUBSAMPLING = {0: (1, 1), 1: (1, 2), 2: (2, 2), 4: (2, 1), 5: (1, 4)}
_LOCAL = threading.local()


class YuvRefused(Exception):
    """This file or this machine cannot take the planar path; the message says why."""


@functools.lru_cache(maxsize=1)
def _library() -> Any:
    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    c_int, c_ulong, c_void_p, c_char_p = ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_char_p
    u8p = ctypes.POINTER(ctypes.c_ubyte)
    lib.tjInitDecompress.restype = c_void_p
    lib.tjInitDecompress.argtypes = []
    lib.tjDecompressHeader3.restype = c_int
    lib.tjDecompressHeader3.argtypes = [c_void_p, u8p, c_ulong, *[ctypes.POINTER(c_int)] * 4]
    lib.tjDecompressToYUVPlanes.restype = c_int
    lib.tjDecompressToYUVPlanes.argtypes = [
        c_void_p,
        u8p,
        c_ulong,
        ctypes.POINTER(u8p),
        c_int,
        ctypes.POINTER(c_int),
        c_int,
        c_int,
    ]
    lib.tjDecodeYUVPlanes.restype = c_int
    lib.tjDecodeYUVPlanes.argtypes = [
        c_void_p,
        ctypes.POINTER(u8p),
        ctypes.POINTER(c_int),
        c_int,
        u8p,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
    ]
    lib.tjPlaneWidth.restype = c_int
    lib.tjPlaneWidth.argtypes = [c_int, c_int, c_int]
    lib.tjPlaneHeight.restype = c_int
    lib.tjPlaneHeight.argtypes = [c_int, c_int, c_int]
    lib.tjGetErrorStr2.restype = c_char_p
    lib.tjGetErrorStr2.argtypes = [c_void_p]
    return lib


def available() -> bool:
    """True when libturbojpeg loads here."""
    return _library() is not None


def _handle() -> tuple[Any, int]:
    """This process's and thread's decompressor (a forked worker makes its own)."""
    lib = _library()
    if lib is None:
        raise YuvRefused("libturbojpeg is not installed (apt install libturbojpeg0)")
    pid = os.getpid()
    if getattr(_LOCAL, "pid", None) != pid:
        handle = lib.tjInitDecompress()
        if not handle:
            raise YuvRefused("tjInitDecompress failed")
        _LOCAL.pid, _LOCAL.handle = pid, handle
    return lib, _LOCAL.handle


def _u8p(a: np.ndarray) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))


def _error(lib: Any, handle: Any) -> str:
    msg = lib.tjGetErrorStr2(handle)
    return msg.decode(errors="replace") if msg else "unknown TurboJPEG error"


def decode_planes(buf: Any, denom: int) -> tuple[list[np.ndarray], int]:
    """``(planes, subsampling)``: the JPEG's component planes on the 1/``denom`` DCT grid (``ceil(size / denom)``
    luma pixels; chroma planes at their subsampled size, TurboJPEG's ``tjPlaneWidth``/``tjPlaneHeight``) and the
    TJSAMP code. One plane for a greyscale JPEG."""
    lib, handle = _handle()
    src = np.frombuffer(buf, np.uint8)
    w, h, sub, cs = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if lib.tjDecompressHeader3(handle, _u8p(src), src.size, *(ctypes.byref(v) for v in (w, h, sub, cs))):
        raise YuvRefused(_error(lib, handle))
    if cs.value not in (TJCS_YCBCR, TJCS_GRAY):  # an RGB, CMYK or YCCK JPEG: its planes are not Y/Cb/Cr
        raise YuvRefused(f"colour space {cs.value} is not YCbCr or grey")
    if sub.value != TJSAMP_GRAY and sub.value not in SUBSAMPLING:
        raise YuvRefused(f"chroma subsampling {sub.value} is not one this path maps")
    ws, hs = -(-w.value // denom), -(-h.value // denom)
    n = 1 if sub.value == TJSAMP_GRAY else 3
    planes = [
        np.empty((lib.tjPlaneHeight(i, hs, sub.value), lib.tjPlaneWidth(i, ws, sub.value)), np.uint8)
        for i in range(n)
    ]
    ptrs = (ctypes.POINTER(ctypes.c_ubyte) * n)(*(_u8p(p) for p in planes))
    strides = (ctypes.c_int * n)(*(p.shape[1] for p in planes))
    if lib.tjDecompressToYUVPlanes(handle, _u8p(src), src.size, ptrs, ws, strides, hs, 0):
        raise YuvRefused(
            _error(lib, handle)
        )  # also libjpeg's warnings (a damaged file): the RGB path reports it
    return planes, sub.value


def plane_shape(index: int, hw: tuple[int, int], subsampling: int) -> tuple[int, int]:
    """The size of plane ``index`` of an image of ``hw`` luma pixels at ``subsampling``."""
    lib = _library()
    if lib is None:
        raise YuvRefused("libturbojpeg is not installed (apt install libturbojpeg0)")
    return lib.tjPlaneHeight(index, hw[0], subsampling), lib.tjPlaneWidth(index, hw[1], subsampling)


def planes_to_rgb(planes: list[np.ndarray], subsampling: int, dst: np.ndarray) -> None:
    """Upsample and convert ``planes`` (each C-contiguous along its rows, any row stride) into ``dst``, an
    ``H x W x 3`` uint8 view whose pixels are contiguous (a row pitch of its own is fine: a slot of a batch)."""
    lib, handle = _handle()
    h, w = dst.shape[:2]
    if dst.strides[1:] != (3, 1) or dst.dtype != np.uint8:
        raise YuvRefused("the RGB destination must be uint8 with contiguous pixels")
    for i, p in enumerate(planes):
        if p.strides[1] != 1 or p.shape != plane_shape(i, (h, w), subsampling):
            raise YuvRefused(
                f"plane {i} is {p.shape}, the output needs {plane_shape(i, (h, w), subsampling)}"
            )
    n = len(planes)
    ptrs = (ctypes.POINTER(ctypes.c_ubyte) * n)(*(_u8p(p) for p in planes))
    strides = (ctypes.c_int * n)(*(p.strides[0] for p in planes))
    if lib.tjDecodeYUVPlanes(
        handle, ptrs, strides, subsampling, _u8p(dst), w, dst.strides[0], h, TJPF_RGB, 0
    ):
        raise YuvRefused(_error(lib, handle))
