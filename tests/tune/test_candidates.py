"""Candidates come from the catalogue's TUNE hooks (a new trick needs no edit under tune/); their skip reasons and
correctness checks - which must be able to fail."""

from __future__ import annotations

import types

import pytest
import torch

import pytorchtricks.tune.candidates as cand
import pytorchtricks.tune.hooks as hooks
from pytorchtricks import catalogue
from pytorchtricks.core import TrickInfo
from pytorchtricks.tunable import TuneFacts, TuneHook
from pytorchtricks.tune.diagnose import conv_bn_pairs
from pytorchtricks.tune.engine import run_tune
from pytorchtricks.tune.measuring import facts_of
from pytorchtricks.tune.workload import build_workload

pytestmark = pytest.mark.isa  # the candidate rules depend on the CPU's capabilities (bf16)


@pytest.fixture
def planted(models_file):
    return build_workload(f"{models_file}:planted", "synthetic", batch_size=8, input_size=16)


def test_conv_bias_pairs_found_by_tracing(planted, models_file):
    bias, pairs = conv_bn_pairs(planted.model_factory())
    assert (bias, pairs) == (["0", "3"], 2)
    clean = build_workload(f"{models_file}:tiny", "synthetic", batch_size=8, input_size=16)
    assert conv_bn_pairs(clean.model_factory()) == ([], 1)


def test_candidates_are_the_catalogue_hooks():
    names = {c.name for c in hooks.all_candidates()}
    with_hook = {t.name for t in catalogue.discover() if getattr(t.load(), "TUNE", None) is not None}
    assert {n.split("[")[0] for n in names} == with_hook
    assert {"make_loader", "cache_in_ram", "pack", "pack[resize]", "autotune_loader"} <= names
    assert set(hooks.with_requirements(("cache_in_ram",))) == {"make_loader", "cache_in_ram"}


@pytest.mark.parametrize("native_bf16", [False, True])
def test_skip_reasons(native_bf16):
    facts = TuneFacts(
        phase="train", device="cpu", verdict="compute-bound", native_bf16=native_bf16, budget_left_s=60
    )
    reasons = {c.name: cand.why_not(c, facts) for c in hooks.all_candidates()}
    assert "CUDA" in reasons["enable_tf32"] and "CPU" in reasons["prefetch_to_device"]
    assert "time budget" in reasons["compile"]
    assert "wait on input" in reasons["make_loader"] and "wait on input" in reasons["pack[resize]"]
    assert (reasons["mixed_precision"] is None) == native_bf16  # no bf16 without native bf16
    assert "nothing to remove" in reasons["remove_conv_bias_before_bn"]
    bound = TuneFacts(verdict="input-bound", data_kind="files", conv_bias_pairs=2, has_conv2d=True)
    assert cand.why_not(hooks.by_name("make_loader"), bound) is None
    assert cand.why_not(hooks.by_name("remove_conv_bias_before_bn"), bound) is None
    synthetic = TuneFacts(verdict="input-bound", data_kind="synthetic")
    assert "synthetic" in cand.why_not(hooks.by_name("cache_in_ram"), synthetic)


def test_a_throwaway_trick_with_a_hook_becomes_a_candidate(planted, monkeypatch):
    """No edit under tune/: a trick module with TUNE is enumerated, applied, checked and measured."""
    seen: list[str] = []

    def apply(setup, state):
        seen.append("applied")
        setup.model.register_forward_hook(lambda m, i, o: o * 1.0)  # exact: changes nothing

    mod = types.ModuleType("throwaway_trick")
    mod.TRICK = TrickInfo(gains=("speed",), phase=("train",), exact=True)
    mod.TUNE = TuneHook(changes="model", check="exact", receipt="ptt.throwaway_(model)", apply=apply, order=1)
    fake = catalogue.Trick("throwaway", "model", "throwaway_trick", mod.TRICK, "Throw-away.", ())
    monkeypatch.setattr(
        catalogue.Trick, "load", lambda self: mod if self.name == "throwaway" else types.ModuleType("x")
    )
    monkeypatch.setattr(catalogue, "discover", lambda: (fake,))
    assert [c.name for c in hooks.all_candidates()] == ["throwaway"]
    res = run_tune(planted, time_budget_s=25)
    row = next(c for c in res.candidates if c.name == "throwaway")
    assert row.status in ("kept", "rejected") and row.check is not None and row.check.passed, row
    assert row.measured is not None and seen


def test_exact_check_passes_for_bias_removal(planted):
    chk = cand.check(planted, ("remove_conv_bias_before_bn",))
    assert chk.passed, chk.detail
    assert chk.metrics["out_rel"] < 1e-5 and chk.metrics["grad_rel"] < 1e-4


def test_exact_check_catches_a_wrong_transform(planted, monkeypatch):
    def broken(setup, state):  # "removes" the bias but also scales a conv: outputs change
        with torch.no_grad():
            setup.model[0].weight.mul_(1.5)
            setup.model[0].bias.zero_()

    c = hooks.by_name("remove_conv_bias_before_bn")
    bad = hooks.Candidate(
        c.name, c.trick, TuneHook(**{**c.hook.__dict__, "apply": broken}), c.phases, True, c.gains
    )
    monkeypatch.setattr(hooks, "all_candidates", lambda: (bad,))
    chk = cand.check(planted, ("remove_conv_bias_before_bn",))
    assert not chk.passed and "grad" in chk.detail


def test_approximate_check_bounds_loss_and_sqnr(planted):
    chk = cand.check(planted, ("mixed_precision",))
    assert chk.passed, chk.detail
    assert chk.metrics["sqnr_db"] >= cand.MIN_SQNR_DB and chk.metrics["loss_rel"] <= cand.LOSS_REL_TOL


def test_data_check_on_real_photos(tmp_path, models_file, jpegs):
    data = jpegs(str(tmp_path / "p"), classes=2, per_class=20, px=96)
    w = build_workload(f"{models_file}:tiny", data, batch_size=8, input_size=32)
    chk = cand.check(w, ("make_loader",))
    assert chk.passed, chk.detail
    assert chk.metrics["psnr_db"] >= 30 and "once each" in chk.detail


def test_facts_describe_the_workload(planted):
    from pytorchtricks.tune.diagnose import diagnose

    facts = facts_of(planted, diagnose(planted, budget_s=1), 60)
    assert facts.data_kind == "synthetic" and facts.conv_bias_pairs == 2 and facts.has_conv2d


def test_sqnr():
    a = torch.ones(100)
    assert cand.sqnr_db(a, a) == float("inf")
    assert abs(cand.sqnr_db(a, a * 1.01) - 40.0) < 1e-3
