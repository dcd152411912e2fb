"""Candidate selection (with reasons for skips) and the per-candidate correctness checks - which must be able to fail."""

from __future__ import annotations

import pytest
import torch

import pytorchtricks.tune.candidates as cand
import pytorchtricks.tune.runner as runner_mod
from pytorchtricks.tune.diagnose import conv_bn_pairs, diagnose
from pytorchtricks.tune.workload import build_workload


@pytest.fixture
def planted(models_file):
    return build_workload(f"{models_file}:planted", "synthetic", batch_size=8, input_size=16)


def test_conv_bias_pairs_found_by_tracing(planted, models_file):
    bias, pairs = conv_bn_pairs(planted.model_factory())
    assert (bias, pairs) == (["0", "3"], 2)
    clean = build_workload(f"{models_file}:tiny", "synthetic", batch_size=8, input_size=16)
    assert conv_bn_pairs(clean.model_factory()) == ([], 1)


def test_skip_reasons(planted):
    diag = diagnose(planted, budget_s=1)
    reasons = {c.name: cand.why_not(c, planted, diag, budget_left_s=60) for c in cand.CANDIDATES}
    assert "CPU" in reasons["pin_memory"]
    assert "CUDA" in reasons["enable_tf32"]
    assert "inference only" in reasons["fuse_conv_bn"]
    assert "time budget" in reasons["compile"]
    assert reasons["loader_workers"] is None


def test_missing_trick_is_skipped_as_not_available(planted, monkeypatch):
    diag = diagnose(planted, budget_s=1)
    monkeypatch.setattr(cand, "ptt_function", lambda name: None)
    assert cand.why_not(cand.by_name("to_channels_last"), planted, diag, 60) == "not available in this build"


def test_exact_check_passes_for_bias_removal(planted):
    if runner_mod.ptt_function("remove_conv_bias_before_bn_") is None:
        pytest.skip("ptt.remove_conv_bias_before_bn_ is not in this build yet")
    chk = cand.check(planted, ("remove_conv_bias_before_bn",), exact=True)
    assert chk.passed, chk.detail
    assert chk.metrics["out_rel"] < 1e-5 and chk.metrics["grad_rel"] < 1e-4


def test_exact_check_catches_a_wrong_transform(planted, monkeypatch):
    def broken(model):  # "removes" the bias but also scales a conv: outputs change
        with torch.no_grad():
            model[0].weight.mul_(1.5)
            model[0].bias.zero_()
        return model

    real = runner_mod.ptt_function
    monkeypatch.setattr(
        runner_mod, "ptt_function", lambda n: broken if n == "remove_conv_bias_before_bn_" else real(n)
    )
    chk = cand.check(planted, ("remove_conv_bias_before_bn",), exact=True)
    assert not chk.passed and "grad" in chk.detail


def test_approximate_check_bounds_loss_and_sqnr(planted):
    if runner_mod.ptt_function("mixed_precision") is None:
        pytest.skip("ptt.mixed_precision is not in this build yet")
    chk = cand.check(planted, ("mixed_precision",), exact=False)
    assert chk.passed, chk.detail
    assert chk.metrics["sqnr_db"] >= cand.MIN_SQNR_DB and chk.metrics["loss_rel"] <= cand.LOSS_REL_TOL


def test_loader_workers_yield_the_same_batches(planted):
    chk = cand.check_loader(planted, 2)
    assert chk.passed, chk.detail


def test_sqnr():
    a = torch.ones(100)
    assert cand.sqnr_db(a, a) == float("inf")
    assert abs(cand.sqnr_db(a, a * 1.01) - 40.0) < 1e-3
