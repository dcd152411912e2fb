"""What this CPU's kernels can do: flags, the ISA limits in force, and the capabilities that decide tricks.

Bottom floor: no torch import at module top, no other pytorchtricks import. The CPU flags come from
``/proc/cpuinfo``; what the kernels actually use is capped by two switches, and both count here:

- ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``): PyTorch's own vectorised ATen kernels;
- ``ONEDNN_MAX_CPU_ISA`` (or the older ``DNNL_MAX_CPU_ISA``; ``AVX2``, ``AVX512_CORE_VNNI``, ...): oneDNN's
  convolutions, matmuls and int8 kernels (PyTorch's copy and the system ``libdnnl2`` both read it at first use);
- ``FBGEMM_ENABLE_INSTRUCTIONS`` (``AVX2``, ``AVX512``, ``AVX512_E1`` = with VNNI): FBGEMM, the int8 kernels of
  eager/FX quantization and dynamic int8 Linear.
MKL (``MKL_ENABLE_INSTRUCTIONS``) runs fp32 GEMMs and is limited too by ``make test``, but decides nothing here;
ONNX Runtime's MLAS has no such switch: its kernels always follow the real CPU.

So on an AVX-512 box run with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` every decision here is the one
an AVX2-only box makes (``make test`` runs the CPU-sensitive tests a second time like that).

Example:
    >>> caps = cpu_caps()
    >>> caps.cpu_class in ("avx2", "avx512", "avx512_bf16", "amx", "other")
    True
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

__all__ = ["CpuCaps", "cpu_caps", "ISA_LIMIT_ENV"]

# The environment that limits the kernels' ISA, recorded with every benchmark result.
ISA_LIMIT_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "MKL_ENABLE_INSTRUCTIONS",
)

FLAGS_OF_INTEREST = (
    "avx2",
    "fma",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)

# oneDNN's ISA ladder (lowest first); a limit allows every rung up to and including itself.
_ONEDNN_LADDER = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
    "ALL",
)
# The rank of the first oneDNN rung that a capability needs.
_RUNG = {name: i for i, name in enumerate(_ONEDNN_LADDER)}


@dataclass(frozen=True)
class CpuCaps:
    """The CPU's model and flags, the ISA limits in force, and what the kernels can therefore do.

    Attributes:
        model: the CPU's model name.
        flags: the flags of interest this CPU has (``/proc/cpuinfo``), whatever the limits.
        aten_limit / onednn_limit / fbgemm_limit: the values of ``ATEN_CPU_CAPABILITY`` / ``ONEDNN_MAX_CPU_ISA`` /
            ``FBGEMM_ENABLE_INSTRUCTIONS`` (None: unset).
        avx512: ATen and oneDNN may both run AVX-512 kernels.
        native_bf16: bf16 matmul/conv run on bf16 instructions (avx512_bf16 or AMX, not limited away); without
            it oneDNN and ATen emulate bf16 through fp32 and it is several times *slower* than fp32.
        vnni: int8 dot products accumulate in int32 directly (avx512_vnni, avx_vnni or AMX); without it the
            AVX2 u8 x s8 kernels (``vpmaddubsw``) add pairs of products into int16 and saturate, so activation
            and weight levels must share 15 bits (``quantize``'s balanced ranges, or ``reduce_range``).
    """

    model: str
    flags: tuple[str, ...]
    aten_limit: str | None
    onednn_limit: str | None
    fbgemm_limit: str | None
    avx512: bool
    native_bf16: bool
    vnni: bool

    @property
    def cpu_class(self) -> str:
        """``amx``, ``avx512_bf16``, ``avx512``, ``avx2`` or ``other``: the class results are filed under."""
        if self.native_bf16 and "amx_bf16" in self.flags:
            return "amx"
        if self.native_bf16:
            return "avx512_bf16"
        if self.avx512:
            return "avx512"
        if "avx2" in self.flags:
            return "avx2"
        return "other"

    @property
    def limited(self) -> bool:
        """True when an ISA limit is set in the environment."""
        return any(v is not None for v in (self.aten_limit, self.onednn_limit, self.fbgemm_limit))

    def describe(self) -> str:
        """One line for receipts and results: ``AMD EPYC (avx2; flags avx2 fma; limits ...)``."""
        limits = ", ".join(
            f"{k}={v}"
            for k, v in (
                ("ATEN", self.aten_limit),
                ("ONEDNN", self.onednn_limit),
                ("FBGEMM", self.fbgemm_limit),
            )
            if v is not None
        )
        return f"{self.model} ({self.cpu_class}; flags {' '.join(self.flags) or 'none'}" + (
            f"; limited: {limits})" if limits else ")"
        )


def _read_cpuinfo() -> tuple[str, frozenset[str]]:
    model = platform.processor() or platform.machine()
    flags: frozenset[str] = frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = frozenset(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model, flags


def _allows(limit: str | None, rung: str) -> bool:
    """True when oneDNN's ISA limit (None: unlimited) allows kernels of ``rung``."""
    if limit is None:
        return True
    # an unknown value: oneDNN ignores it (and runs unlimited)
    return _RUNG.get(limit.upper(), _RUNG["ALL"]) >= _RUNG[rung]


def caps_from(
    model: str, present: frozenset[str] | set[str], env: dict[str, str] | os._Environ[str]
) -> CpuCaps:
    """The capabilities of a CPU with flags ``present`` under the limits in ``env`` (pure; for tests).

    Example:
        >>> zen4 = {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
        >>> caps_from("zen4", zen4, {}).cpu_class, caps_from("zen4", zen4, {}).vnni
        ('avx512_bf16', True)
        >>> avx2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
        >>> lim = caps_from("zen4", zen4, avx2)
        >>> lim.cpu_class, lim.vnni, lim.native_bf16
        ('avx2', False, False)
    """
    aten = env.get("ATEN_CPU_CAPABILITY") or None
    onednn = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or None
    fbgemm = env.get("FBGEMM_ENABLE_INSTRUCTIONS") or None
    # FBGEMM's values without VNNI: AVX2, AVX512, AVX512_256 (AVX512_E1* keep it)
    fbgemm_vnni = fbgemm is None or fbgemm.upper().startswith("AVX512_E1")
    aten_avx512 = aten is None or aten.lower() in ("avx512", "avx512_vnni", "avx512_bf16")
    has_512 = "avx512f" in present and "avx512bw" in present
    avx512 = has_512 and aten_avx512 and _allows(onednn, "AVX512_CORE")
    bf16_hw = ("avx512_bf16" in present and has_512) or "amx_bf16" in present
    native_bf16 = bf16_hw and aten_avx512 and _allows(onednn, "AVX512_CORE_BF16")
    vnni = fbgemm_vnni and (
        ("avx512_vnni" in present and has_512 and _allows(onednn, "AVX512_CORE_VNNI"))
        or ("amx_int8" in present and _allows(onednn, "AVX512_CORE_AMX"))
        or ("avx_vnni" in present and _allows(onednn, "AVX2_VNNI"))
    )
    flags = tuple(f for f in FLAGS_OF_INTEREST if f in present)
    return CpuCaps(model, flags, aten, onednn, fbgemm, avx512, native_bf16, vnni)


@functools.lru_cache(maxsize=1)
def cpu_caps() -> CpuCaps:
    """This CPU's capabilities under the ISA limits of this process's environment (read once)."""
    model, present = _read_cpuinfo()
    return caps_from(model, present, os.environ)
