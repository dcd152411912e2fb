from __future__ import annotations

import warnings

import pytest
import torch

import pytorchtricks as ptt


def test_call_sets_and_with_restores() -> None:
    before = torch.backends.cudnn.benchmark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptt.NoEffectWarning)
        with ptt.enable_cudnn_benchmark():
            assert torch.backends.cudnn.benchmark is True
            with ptt.enable_cudnn_benchmark(False):
                assert torch.backends.cudnn.benchmark is False
            assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.benchmark is before
        switch = ptt.enable_cudnn_benchmark()  # call form: stays on until restored
        assert torch.backends.cudnn.benchmark is True
        switch.restore()
        switch.restore()  # idempotent
        assert torch.backends.cudnn.benchmark is before


def test_restores_even_when_the_block_raises() -> None:
    before = torch.backends.cudnn.benchmark
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore", ptt.NoEffectWarning)
        with ptt.enable_cudnn_benchmark():
            raise RuntimeError("boom")
    assert torch.backends.cudnn.benchmark is before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU no-op warning")
def test_warns_no_effect_without_cuda() -> None:
    with pytest.warns(ptt.NoEffectWarning, match="no effect without CUDA"):
        ptt.enable_cudnn_benchmark().restore()


def test_bench_case_outputs_agree() -> None:
    from pytorchtricks.tricks.runtime.enable_cudnn_benchmark import bench_case

    case = bench_case("smoke")
    torch.testing.assert_close(case.baseline(), case.treated())
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.gpu
def test_cuda_conv_matches_with_benchmark() -> None:
    conv = torch.nn.Conv2d(8, 8, 3).cuda()
    x = torch.randn(2, 8, 16, 16, device="cuda")
    ref = conv(x)
    with ptt.enable_cudnn_benchmark():
        torch.testing.assert_close(conv(x), ref, rtol=1e-4, atol=1e-4)
