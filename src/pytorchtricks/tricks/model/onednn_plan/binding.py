"""The ctypes binding to the system oneDNN 2.x C API (Debian ``libdnnl2``): constants, loading, status checks."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

import torch

# oneDNN 2.x C API constants (dnnl_types.h; stable across 2.x)
F32, S32, S8, U8 = 3, 4, 5, 6
FORMAT_ANY = 1
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT, POOLING_MAX, POOLING_AVG_EXCLUDE_PADDING = 1, 511, 1023
ELTWISE_RELU, ELTWISE_CLIP, ELTWISE_HARDSWISH, ELTWISE_SWISH, ELTWISE_GELU_ERF, ELTWISE_GELU_TANH = (
    31,
    255,
    112,
    223,
    48,
    207,
)
ELTWISE_LINEAR, ELTWISE_CLIP_V2 = 127, 16  # clip_v2: the 7-bit range clip (see _fused)
QUERY_WEIGHTS_MD, QUERY_IMPL_INFO_STR = 131, 8
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41
ENGINE_CPU, STREAM_DEFAULT = 1, 1
_DESC_BYTES = 16384  # op descriptors are opaque here; 2.6's largest (convolution) is 5976 bytes
_MD_BYTES = 2048  # dnnl_memory_desc_t is 696 bytes in 2.6

_LIB: Any = None
_LIB_LOCK = threading.Lock()


class PlanUnsupported(Exception):
    """The graph (or this machine) has something the oneDNN plan does not lower; the message says what."""


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
    ]


def _load() -> Any:
    """The system oneDNN 2.x library with its C API typed, or ``PlanUnsupported`` saying how to install it."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is not None:
            return _LIB
        name = ctypes.util.find_library("dnnl")
        if name is None:
            raise PlanUnsupported(
                "the system oneDNN library is not installed (Debian/Ubuntu: apt-get install libdnnl2; "
                "`make system-deps` does it)"
            )
        torch.get_num_threads()  # torch's OpenMP runtime is loaded first, so oneDNN's libgomp.so.1 resolves to it
        lib = ctypes.CDLL(name)
        lib.dnnl_version.restype = ctypes.POINTER(_Version)
        ver = lib.dnnl_version().contents
        if ver.major != 2 or ver.minor < 5:
            raise PlanUnsupported(
                f"system oneDNN is {ver.major}.{ver.minor}; the plan needs the 2.x C API (2.5 or newer)"
            )
        # argument types of the C functions used (pointers to dims / scales / zero points are passed as void*)
        vp, out, i, f = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_float
        # fmt: off
        sigs: dict[str, list[Any]] = {
            "dnnl_engine_create": [out, i, ctypes.c_size_t],
            "dnnl_stream_create": [out, vp, ctypes.c_uint],
            "dnnl_stream_wait": [vp],
            "dnnl_memory_desc_init_by_strides": [vp, i, vp, i, vp],
            "dnnl_memory_desc_init_by_tag": [vp, i, vp, i, i],
            "dnnl_memory_create": [out, vp, vp, vp],
            "dnnl_memory_set_data_handle": [vp, vp],
            "dnnl_memory_destroy": [vp],
            "dnnl_primitive_attr_create": [out],
            "dnnl_primitive_attr_destroy": [vp],
            "dnnl_primitive_attr_set_output_scales": [vp, ctypes.c_int64, i, vp],
            "dnnl_primitive_attr_set_zero_points": [vp, i, ctypes.c_int64, i, vp],
            "dnnl_primitive_attr_set_post_ops": [vp, vp],
            "dnnl_post_ops_create": [out],
            "dnnl_post_ops_destroy": [vp],
            "dnnl_post_ops_append_sum_v3": [vp, f, ctypes.c_int32, i],
            "dnnl_post_ops_append_eltwise": [vp, f, i, f, f],
            "dnnl_dilated_convolution_forward_desc_init": [vp, i, i, vp, vp, vp, vp, vp, vp, vp, vp],
            "dnnl_pooling_v2_forward_desc_init": [vp, i, i, vp, vp, vp, vp, vp, vp, vp],
            "dnnl_inner_product_forward_desc_init": [vp, i, vp, vp, vp, vp],
            "dnnl_primitive_desc_create": [out, vp, vp, vp, vp],
            "dnnl_reorder_primitive_desc_create": [out, vp, vp, vp, vp, vp],
            "dnnl_primitive_desc_destroy": [vp],
            "dnnl_primitive_create": [out, vp],
            "dnnl_primitive_destroy": [vp],
            "dnnl_primitive_execute": [vp, vp, i, vp],
            "dnnl_primitive_desc_query": [vp, i, i, vp],
        }
        # fmt: on
        for fn, argtypes in sigs.items():
            f = getattr(lib, fn)
            f.argtypes, f.restype = argtypes, ctypes.c_int
        lib.dnnl_primitive_desc_query_md.argtypes = [vp, i, i]
        lib.dnnl_primitive_desc_query_md.restype = vp
        lib.dnnl_memory_desc_get_size.argtypes = [vp]
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        _LIB = lib
        return lib


def onednn_available() -> bool:
    """True when the system oneDNN 2.x library loads (the plan can be built on this machine)."""
    try:
        _load()
    except (PlanUnsupported, OSError):
        return False
    return True


def _check(status: int, what: str) -> None:
    if status != 0:
        raise PlanUnsupported(f"oneDNN refused {what} (dnnl_status {status})")


def _dims(values: tuple[int, ...] | list[int]) -> Any:
    return (ctypes.c_int64 * 12)(*values)
