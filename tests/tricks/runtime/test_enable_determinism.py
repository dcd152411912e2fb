from __future__ import annotations

import os

import torch

import pytorchtricks as ptt
from pytorchtricks.tricks.runtime.enable_determinism import CUBLAS_VAR


def test_sets_every_flag_and_restores(monkeypatch) -> None:
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    torch.backends.cudnn.benchmark = True
    try:
        with ptt.enable_determinism():
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
            assert torch.backends.cudnn.deterministic is True
            assert torch.backends.cudnn.benchmark is False
            assert os.environ[CUBLAS_VAR] == ":4096:8"
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic is False
        assert torch.backends.cudnn.benchmark is True
        assert CUBLAS_VAR not in os.environ
    finally:
        torch.backends.cudnn.benchmark = False


def test_keeps_a_user_cublas_setting(monkeypatch) -> None:
    monkeypatch.setenv(CUBLAS_VAR, ":16:8")
    with ptt.enable_determinism():
        assert os.environ[CUBLAS_VAR] == ":16:8"
    assert os.environ[CUBLAS_VAR] == ":16:8"


def test_warn_only_and_call_form() -> None:
    switch = ptt.enable_determinism(warn_only=True)
    try:
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        switch.restore()
    assert not torch.are_deterministic_algorithms_enabled()


def test_two_runs_of_a_training_step_are_bitwise_equal() -> None:
    def run() -> torch.Tensor:
        with ptt.seed_everything(3), ptt.enable_determinism():
            conv = torch.nn.Conv2d(4, 4, 3)
            x = torch.randn(2, 4, 9, 9)
            idx = torch.randint(0, 3, (8,))
            y = torch.zeros(3, 7, 7).index_add_(0, idx, conv(x).flatten(0, 1))
            y.sum().backward()
            return conv.weight.grad.clone()

    assert torch.equal(run(), run())


def test_bench_case_check_passes() -> None:
    from pytorchtricks.tricks.runtime.enable_determinism import bench_case

    case = bench_case("smoke")
    assert case.check is not None
    case.check(case.baseline(), case.treated())
    assert not torch.are_deterministic_algorithms_enabled()
