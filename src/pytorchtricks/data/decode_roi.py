"""Region-of-interest JPEG decode: only the rows and iMCU columns a crop needs, at a DCT scale, via the system libjpeg.

libjpeg-turbo (>= 1.5) can decode a window of a baseline JPEG: ``jpeg_crop_scanline`` narrows the output to the
iMCU columns that hold the crop (moving the left edge down to an iMCU boundary), ``jpeg_skip_scanlines`` skips the
rows above it (entropy-decoded, but no inverse DCT, upsampling or colour conversion) and decoding stops after the
crop's last row. With ``scale_denom`` the window is also DCT-scaled. Neither PyTurboJPEG (TurboJPEG 2.x has no
lossy cropped decode) nor simplejpeg exposes the window calls, and libjpeg reports errors by ``longjmp``, which
ctypes cannot catch: so a ~100-line C shim (``_SOURCE``: an error manager with ``setjmp`` that returns the message
as a string) is compiled at first use with the system C compiler against the Debian headers
(``libjpeg62-turbo-dev``) into ``$PTT_CACHE_DIR`` (``$XDG_CACHE_HOME/pytorchtricks``, ``~/.cache/pytorchtricks``)
and loaded with ctypes. The file name carries the hash of the source, so a changed shim builds anew; the build
writes a temp file and renames it (atomic), under a file lock (workers starting together build once); a folder or
library another user could have written is refused (it would be loaded as code).

No compiler, no headers or a load failure: ``window_decoder()`` is None with the reason (``unavailable_reason``)
and ``data.decode`` uses its other backends. Progressive JPEGs (every scan must be read before any pixel),
non-YCbCr/grey colour spaces and subsamplings other than 4:4:4, 4:2:2, 4:2:0, 4:4:0 are refused with a reason, and
the caller falls back (and counts it).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytorchtricks.core import cache_root

# Return codes of ptt_roi_decode
OK, UNSUPPORTED, FAILED, BAD_WINDOW = 0, 1, 2, 3
# Widest iMCU in output pixels: max_h_samp_factor (<= 4) x the scaled DCT block (8 at scale 1)
MAX_ALIGN = 32

_SOURCE = r"""
#include <stdio.h>
#include <string.h>
#include <setjmp.h>
#include <jpeglib.h>

struct ptt_err { struct jpeg_error_mgr pub; jmp_buf jump; char *msg; int msglen; };

static void ptt_format(j_common_ptr cinfo) {
  struct ptt_err *e = (struct ptt_err *)cinfo->err;
  char buf[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, buf);
  snprintf(e->msg, (size_t)e->msglen, "%s", buf);
}
static void ptt_error_exit(j_common_ptr cinfo) {
  ptt_format(cinfo);
  longjmp(((struct ptt_err *)cinfo->err)->jump, 1);
}
/* A warning (corrupt data, premature end) stops the decode too: the caller then decodes on its strict path. */
static void ptt_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0) ptt_error_exit(cinfo);
}
static void ptt_output_message(j_common_ptr cinfo) { (void)cinfo; /* never print */ }

static const char *ptt_refuse(j_decompress_ptr c) {
  if (c->progressive_mode) return "progressive";
  if (c->num_components == 1 && c->jpeg_color_space == JCS_GRAYSCALE) return NULL;
  if (c->num_components != 3 || c->jpeg_color_space != JCS_YCbCr) return "colour space";
  if (c->comp_info[1].h_samp_factor != 1 || c->comp_info[1].v_samp_factor != 1 ||
      c->comp_info[2].h_samp_factor != 1 || c->comp_info[2].v_samp_factor != 1) return "subsampling";
  if (c->comp_info[0].h_samp_factor > 2 || c->comp_info[0].v_samp_factor > 2) return "subsampling";
  return NULL;
}

int ptt_roi_version(void) { return LIBJPEG_TURBO_VERSION_NUMBER; }

/* Decode output rows [top, top + rows) and the columns [left, left + width) (widened left to an iMCU boundary) of
   the image decoded at 1/denom, into out (rows x info[8] x 3, row stride info[8] * 3, info[8] <= cap_width).
   info: [0] width [1] height [2] components [3] progressive [4] h_samp [5] v_samp [6] output width
   [7] window x offset [8] window width [9] output height. */
int ptt_roi_decode(const unsigned char *data, unsigned long size, int denom, int top, int rows, int left,
                   int width, unsigned char *out, int cap_width, int *info, char *msg, int msglen) {
  struct jpeg_decompress_struct cinfo;
  struct ptt_err jerr;
  const char *why;
  JDIMENSION xoff, w;
  JSAMPROW ptrs[16];
  int n, k;
  cinfo.err = jpeg_std_error(&jerr.pub);
  jerr.pub.error_exit = ptt_error_exit;
  jerr.pub.emit_message = ptt_emit_message;
  jerr.pub.output_message = ptt_output_message;
  jerr.msg = msg;
  jerr.msglen = msglen;
  msg[0] = 0;
  jpeg_create_decompress(&cinfo);
  if (setjmp(jerr.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return 2;
  }
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  info[0] = (int)cinfo.image_width;
  info[1] = (int)cinfo.image_height;
  info[2] = cinfo.num_components;
  info[3] = cinfo.progressive_mode;
  info[4] = cinfo.comp_info[0].h_samp_factor;
  info[5] = cinfo.comp_info[0].v_samp_factor;
  why = ptt_refuse(&cinfo);
  if (why != NULL) {
    snprintf(msg, (size_t)msglen, "%s", why);
    jpeg_destroy_decompress(&cinfo);
    return 1;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = (unsigned int)denom;
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  info[6] = (int)cinfo.output_width;
  info[9] = (int)cinfo.output_height;
  if (top < 0 || rows <= 0 || left < 0 || width <= 0 || (JDIMENSION)(top + rows) > cinfo.output_height ||
      (JDIMENSION)(left + width) > cinfo.output_width) {
    snprintf(msg, (size_t)msglen, "window outside the %ux%u output", cinfo.output_height, cinfo.output_width);
    jpeg_destroy_decompress(&cinfo);
    return 3;
  }
  xoff = (JDIMENSION)left;
  w = (JDIMENSION)width;
  jpeg_crop_scanline(&cinfo, &xoff, &w);
  info[7] = (int)xoff;
  info[8] = (int)w;
  if ((int)w > cap_width) {
    snprintf(msg, (size_t)msglen, "window widened to %u columns, buffer holds %d", w, cap_width);
    jpeg_destroy_decompress(&cinfo);
    return 3;
  }
  if (top > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
  while (cinfo.output_scanline < (JDIMENSION)(top + rows)) {
    n = top + rows - (int)cinfo.output_scanline;
    if (n > 16) n = 16;
    for (k = 0; k < n; k++) ptrs[k] = out + (size_t)((int)cinfo.output_scanline - top + k) * w * 3;
    jpeg_read_scanlines(&cinfo, ptrs, (JDIMENSION)n);
  }
  jpeg_destroy_decompress(&cinfo); /* the rows below the window are never decoded */
  return 0;
}
"""


@dataclass(frozen=True)
class Window:
    """What a window decode returned: ``pixels`` (rows x width x 3, RGB) cover output columns from ``x0``."""

    pixels: np.ndarray
    x0: int


class Refused(Exception):
    """The JPEG is outside what the window path decodes (``reason``: progressive, subsampling, colour space,
    corrupt); the caller decodes it on its usual path."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def library_path() -> str:
    """Where the compiled shim lives: the name holds the hash of its source and the machine."""
    key = hashlib.sha256(f"{_SOURCE}|{platform.machine()}|{platform.system()}".encode()).hexdigest()[:16]
    return cache_root("jpeg_roi", f"ptt_jpeg_roi-{key}.so")


def build(path: str) -> None:
    """Compile the shim to ``path`` (temp file + rename, under ``path + '.lock'``); a clear error if it cannot."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc/gcc) on PATH: apt-get install gcc (`make system-deps` does it)")
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    check_private(folder)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it: wait, then reuse its file
        if os.path.exists(path):
            return
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = os.path.join(tmp, "ptt_jpeg_roi.c"), os.path.join(tmp, "ptt_jpeg_roi.so")
            with open(src, "w") as f:
                f.write(_SOURCE)
            cmd = [*cc.split(), "-O2", "-shared", "-fPIC", "-o", out, src, "-ljpeg"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            if res.returncode != 0:
                tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
                raise OSError(
                    f"compiling the JPEG window shim failed ({' '.join(tail)}): install the libjpeg-turbo "
                    "headers (apt-get install libjpeg62-turbo-dev; `make system-deps` does it)"
                )
            os.replace(out, path)


def check_private(folder: str) -> None:
    """Refuse (``OSError``) a shim folder another user could write to: the library in it is loaded as code."""
    st = os.stat(folder)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(
            f"{folder} is not private to this user (owner uid {st.st_uid}, mode {oct(st.st_mode & 0o777)}); the "
            "JPEG window shim is not loaded from it: set PTT_CACHE_DIR to a folder of your own"
        )


_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _load() -> Any:
    with _LOCK:
        if "lib" in _STATE:
            return _STATE["lib"]
        lib, reason = None, ""
        try:
            path = library_path()
            if not os.path.exists(path):
                build(path)
            check_private(os.path.dirname(path))
            if os.stat(path).st_uid != os.getuid():
                raise OSError(f"{path} belongs to another user; the JPEG window shim is not loaded from it")
            # ctypes drops the GIL during each call: decodes in several threads run in parallel
            handle = ctypes.CDLL(path)
            handle.ptt_roi_version.restype = ctypes.c_int
            handle.ptt_roi_decode.restype = ctypes.c_int
            handle.ptt_roi_decode.argtypes = [
                ctypes.c_void_p,
                ctypes.c_ulong,
                *(ctypes.c_int,) * 5,
                ctypes.c_void_p,
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_int,
            ]
            if handle.ptt_roi_version() < 1005000:  # the headers' version; the shim links that library
                raise OSError(f"libjpeg-turbo {handle.ptt_roi_version()} has no window decode (needs >= 1.5)")
            lib = handle
        except (OSError, subprocess.SubprocessError) as exc:
            reason = str(exc)
        _STATE["lib"], _STATE["reason"] = lib, reason
        return lib


def window_decoder() -> Any:
    """The loaded shim (building it on first use), or None when it cannot be built or loaded here."""
    return _STATE["lib"] if "lib" in _STATE else _load()


def unavailable_reason() -> str:
    """Why ``window_decoder()`` is None ("" when it works)."""
    window_decoder()
    return str(_STATE.get("reason", ""))


def reset() -> None:
    """Forget the loaded shim (tests: load again, e.g. with another cache dir)."""
    with _LOCK:
        _STATE.clear()


def imcu_align(h_samp: int, denom: int, gray: bool) -> int:
    """Width in output pixels of one iMCU column at scale 1/``denom``: where ``jpeg_crop_scanline`` may start.

    Example:
        >>> imcu_align(2, 1, False), imcu_align(2, 4, False), imcu_align(1, 8, False), imcu_align(2, 2, True)
        (16, 4, 1, 4)
    """
    block = 8 // denom
    return block if gray else block * h_samp


def aligned_window(left: int, width: int, align: int) -> tuple[int, int]:
    """``(x0, width)`` of the window libjpeg decodes for columns ``[left, left + width)``: the left edge moved down
    to a multiple of ``align``, the right edge kept.

    Example:
        >>> aligned_window(37, 100, 16), aligned_window(32, 8, 16), aligned_window(0, 5, 8)
        ((32, 105), (32, 8), (0, 5))
    """
    x0 = (left // align) * align
    return x0, width + left - x0


def decode_window(data: Any, denom: int, top: int, bottom: int, left: int, right: int) -> Window:
    """Rows ``[top, bottom)`` and columns ``[left, right)`` of the image decoded at 1/``denom`` (coordinates in
    that scaled image), as RGB, plus the columns libjpeg added on the left to reach an iMCU boundary.

    Raises ``Refused`` for what the window path does not decode (the caller falls back) and ``OSError`` when the
    shim is unavailable.
    """
    lib = window_decoder()
    if lib is None:
        raise OSError(unavailable_reason())
    raw = data if isinstance(data, bytes) else bytes(data)
    rows, width = bottom - top, right - left
    cap = width + MAX_ALIGN
    out = np.empty((rows, cap, 3), np.uint8)
    info = (ctypes.c_int * 10)()
    msg = ctypes.create_string_buffer(256)
    rc = lib.ptt_roi_decode(
        raw, len(raw), denom, top, rows, left, width, out.ctypes.data, cap, info, msg, len(msg)
    )
    text = msg.value.decode(errors="replace")
    if rc == UNSUPPORTED:
        raise Refused(text)
    if rc == FAILED:
        raise Refused("corrupt", text)
    if rc != OK:
        raise Refused("window", text)
    w = info[8]
    return Window(pixels=out.reshape(-1)[: rows * w * 3].reshape(rows, w, 3), x0=int(info[7]))


@functools.cache
def works() -> bool:
    """True when the shim loads and decodes a small JPEG window correctly in this process (probed once)."""
    try:
        import io

        from PIL import Image

        ramp = np.linspace(0, 255, 48 * 64 * 3).astype(np.uint8).reshape(48, 64, 3)
        buf = io.BytesIO()
        Image.fromarray(ramp).save(buf, "JPEG", quality=95)
        win = decode_window(buf.getvalue(), 2, 4, 20, 9, 30)
        return win.pixels.shape == (16, 30 - win.x0, 3) and win.x0 <= 9
    except Exception:
        return False
