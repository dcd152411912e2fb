"""cpu_caps: the capabilities that decide tricks, from the CPU's flags and the ISA limits in force."""

from __future__ import annotations

import os

import pytest
import torch

from pytorchtricks.hardware import caps_from, cpu_caps

ZEN3 = {"avx2", "fma"}
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
SKYLAKE_SP = ZEN3 | {"avx512f", "avx512bw"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"}
ALDER_LAKE = ZEN3 | {"avx_vnni"}
AVX2_LIMITS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
}


@pytest.mark.parametrize(
    ("flags", "cls", "vnni", "bf16"),
    [
        (ZEN3, "avx2", False, False),
        (SKYLAKE_SP, "avx512", False, False),
        (ZEN4, "avx512_bf16", True, True),
        (SAPPHIRE_RAPIDS, "amx", True, True),
        (ALDER_LAKE, "avx2", True, False),  # AVX-VNNI: int32 accumulation without AVX-512
        (set(), "other", False, False),
    ],
)
def test_classes_from_flags(flags: set[str], cls: str, vnni: bool, bf16: bool) -> None:
    caps = caps_from("cpu", flags, {})
    assert (caps.cpu_class, caps.vnni, caps.native_bf16) == (cls, vnni, bf16)
    assert not caps.limited


@pytest.mark.parametrize("flags", [ZEN4, SAPPHIRE_RAPIDS, SKYLAKE_SP, ALDER_LAKE])
def test_avx2_limits_make_every_cpu_an_avx2_one(flags: set[str]) -> None:
    caps = caps_from("cpu", flags, AVX2_LIMITS)
    assert (caps.cpu_class, caps.vnni, caps.native_bf16, caps.avx512) == ("avx2", False, False, False)
    assert caps.limited and "limited" in caps.describe()


def test_each_library_limit_counts_on_its_own() -> None:
    # oneDNN below VNNI: its int8 kernels saturate even though ATen may use AVX-512
    assert not caps_from("c", ZEN4, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}).vnni
    assert caps_from("c", ZEN4, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}).vnni
    assert not caps_from("c", ZEN4, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}).native_bf16
    assert not caps_from("c", ZEN4, {"DNNL_MAX_CPU_ISA": "avx2"}).avx512  # the older name, any case
    assert not caps_from("c", ZEN4, {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"}).vnni
    assert caps_from("c", ZEN4, {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1"}).vnni
    assert not caps_from("c", ZEN4, {"ATEN_CPU_CAPABILITY": "avx2"}).native_bf16
    # a value oneDNN does not know is ignored by oneDNN, so it limits nothing here either
    assert caps_from("c", ZEN4, {"ONEDNN_MAX_CPU_ISA": "BOGUS"}).vnni


@pytest.mark.isa
def test_this_process_agrees_with_torch() -> None:
    caps = cpu_caps()
    aten = torch.backends.cpu.get_cpu_capability()  # what ATen dispatches to after ATEN_CPU_CAPABILITY
    if aten in ("AVX2", "DEFAULT"):
        assert not caps.avx512 and not caps.native_bf16
    if caps.avx512:
        assert aten.startswith("AVX512")
    if not os.environ.get("ONEDNN_MAX_CPU_ISA") and not os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS"):
        f = set(caps.flags)
        has512 = {"avx512f", "avx512bw"} <= f
        assert caps.vnni == ("avx_vnni" in f or "amx_int8" in f or ("avx512_vnni" in f and has512))
