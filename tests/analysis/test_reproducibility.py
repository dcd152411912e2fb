from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import pytorchtricks as ptt


def _make_step(noise_gen_seed: int | None = None, nondet_step: int = 1):
    def make_step():
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        # an "unseeded" generator: seeded from the OS, as code that builds its own Generator often does
        rogue = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))

        def step(i: int) -> nn.Module:
            opt.zero_grad()
            x = torch.randn(32, 8)
            if noise_gen_seed is None and i >= nondet_step:
                x = x + torch.randn(32, 8, generator=rogue)  # unseeded dropout-like noise on the input
            model(x).pow(2).mean().backward()
            opt.step()
            return model

        return step

    return make_step


def test_passes_on_seeded_cpu_model_with_dropout() -> None:
    report = ptt.check_reproducible(_make_step(noise_gen_seed=0), steps=4)
    assert report.ok, str(report)
    assert "reproducible" in str(report)


def test_finds_injected_nondeterminism_and_names_step_and_tensor() -> None:
    report = ptt.check_reproducible(_make_step(nondet_step=2), steps=4)
    assert not report.ok
    assert report.step == 2
    assert report.tensor == "0.weight"  # first entry of the state dict that differs
    assert report.max_abs_diff is not None and report.max_abs_diff > 0
    assert "step 2" in str(report) and "0.weight" in str(report)


def test_compares_dicts_and_restores_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)

    def make_step():
        return lambda i: {"loss": torch.rand(2), "aux": [torch.ones(1) * i]}

    assert ptt.check_reproducible(make_step, steps=2).ok
    assert torch.equal(torch.rand(1), expected)


def test_bad_input() -> None:
    with pytest.raises(ptt.PttError, match="steps must be"):
        ptt.check_reproducible(lambda: lambda i: None, steps=0)
    with pytest.raises(ptt.PttError, match="return a Module"):
        ptt.check_reproducible(lambda: lambda i: "nope", steps=1)
