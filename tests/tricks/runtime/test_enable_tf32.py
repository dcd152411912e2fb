from __future__ import annotations

import warnings

import pytest
import torch

import pytorchtricks as ptt


def test_with_sets_precision_and_restores_both_flags() -> None:
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptt.NoEffectWarning)
        with ptt.enable_tf32():
            assert torch.get_float32_matmul_precision() == "high"
            assert torch.backends.cudnn.allow_tf32 is True
        with ptt.enable_tf32(False):
            assert torch.get_float32_matmul_precision() == "highest"
            assert torch.backends.cudnn.allow_tf32 is False
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU no-op warning")
def test_warns_no_effect_on_cpu() -> None:
    with pytest.warns(ptt.NoEffectWarning, match="TF32 needs a CUDA GPU"):
        ptt.enable_tf32().restore()


def test_disabling_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ptt.NoEffectWarning)
        ptt.enable_tf32(False).restore()


def test_bench_case_error_bound_holds_and_state_is_restored() -> None:
    from pytorchtricks.tricks.runtime.enable_tf32 import bench_case

    before = torch.get_float32_matmul_precision()
    case = bench_case("smoke")
    base, treated = case.baseline(), case.treated()
    assert case.check is not None
    case.check(base, treated)
    with pytest.raises(AssertionError, match="relative error"):
        case.check(base, base * 1.5)
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.gpu
def test_tf32_matmul_error_is_bounded_on_gpu() -> None:
    a, b = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    ref = (a.double() @ b.double()).float()
    with ptt.enable_tf32():
        out = a @ b
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2
