"""A progressive JPEG's first passes: the file cut before its first refinement scan, for a decode at a DCT scale.

Why: a progressive JPEG (``SOF2``) sends each coefficient in a first pass at reduced precision (its point transform
``Al``: the value's low ``Al`` bits dropped) and then in refinement scans that add one bit each. Their entropy
decoding is paid whatever size the image is decoded at: for a 1/2-1/8 scaled decode of a 10-24 MP photo it is most
of the time (a DCT-scaled decode saves the inverse DCT, upsampling and colour work, not the Huffman decoding). Cut
before its first refinement scan, the file is still a valid progressive JPEG: every coefficient at its first-pass
precision - within ``2**Al`` quantization steps (libjpeg's default script: DC ``Al=1``, luma AC ``Al=2``, chroma AC
``Al=1``) - in about a quarter to a half of the bytes, with 2-3x less entropy decoding.

When: a decode at DCT scale 1/2 or smaller: each output pixel averages 2x2 or more input pixels, and with them the
rounding noise of the dropped bits.

Caveats: approximate (what it costs is measured against the full decode and against Ultralytics' stock load on the
tests' photos); nothing is cut from a baseline JPEG (``None``), from a file whose first passes do not cover every
coefficient of every component, or from one this parser does not follow (arithmetic coding, a malformed segment):
those decode whole.
"""

from __future__ import annotations

import re
import struct
from typing import Any

__all__ = ["first_passes"]

# the next marker after entropy-coded data: 0xFF not followed by a stuffed 0x00, a restart marker or a fill byte
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def first_passes(data: Any) -> bytes | None:
    """``data`` (a JPEG) cut before its first refinement scan and closed with ``EOI``, or ``None`` when there is
    nothing to cut (a baseline JPEG, no refinement scan) or the first passes leave a coefficient without any
    value.

    Example:
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "JPEG", progressive=True)
        >>> cut = first_passes(buf.getvalue())
        >>> cut is not None and len(cut) < len(buf.getvalue()), Image.open(io.BytesIO(cut)).size
        (True, (64, 48))
    """
    b = bytes(data) if not isinstance(data, bytes) else data
    if b[:2] != b"\xff\xd8":
        return None
    try:
        return _cut(b)
    except (IndexError, struct.error):
        return None  # a segment cut short: decoded whole, where the decoder says what is wrong


def _cut(b: bytes) -> bytes | None:
    comps: list[int] = []
    covered: dict[int, set[int]] = {}
    i, progressive = 2, False
    while i + 4 <= len(b):
        if b[i] != 0xFF:
            return None
        m = b[i + 1]
        if m == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if m == 0xD9:  # EOI: no refinement scan
            return None
        (length,) = struct.unpack_from(">H", b, i + 2)
        if m in (0xC0, 0xC1, 0xC3, 0xC9, 0xCA, 0xCB):  # baseline / extended / lossless / arithmetic: not ours
            return None
        if m == 0xC2:
            progressive = True
            comps = [b[i + 10 + 3 * k] for k in range(b[i + 9])]
            covered = {c: set() for c in comps}
        if m == 0xDA:
            if not progressive:
                return None
            ns = b[i + 4]
            ids = [b[i + 5 + 2 * k] for k in range(ns)]
            p = i + 5 + 2 * ns
            ss, se, ah = b[p], b[p + 1], b[p + 2] >> 4
            if ah > 0:  # the first refinement scan: cut here, if every coefficient has its first pass
                if all(len(covered.get(c, ())) == 64 for c in comps):
                    return b[:i] + b"\xff\xd9"
                return None
            for c in ids:
                if c not in covered:
                    return None
                covered[c].update(range(ss, se + 1))
            nxt = _MARKER.search(b, i + 2 + length)
            if nxt is None:
                return None
            i = nxt.start()
            continue
        i += 2 + length
    return None
