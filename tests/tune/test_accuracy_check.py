"""``ptt tune --accuracy-steps N``: the parity check of the recommended pipeline (``tune.accuracy``).

The rule on figures (and its calibration, simulated), then end to end through ``tune_model`` on a tiny model that
learns two JPEG classes (its loss falls from ~2.3 to ~1.2 in the check's steps): a recommendation that changes only
speed (channels_last) learns the same; one that changes what the model learns (a trick injected here: labels
shuffled, or the learning rate x100) is reported outside - the check can fail. No timing is asserted: the
recommendation is fixed by the test (tune's measuring phases are not what is tested here).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import pytorchtricks.tune.engine as engine
import pytorchtricks.tune.hooks as hooks
from pytorchtricks.cli import build_parser
from pytorchtricks.core import PttError
from pytorchtricks.tunable import TuneHook
from pytorchtricks.tune.accuracy import (
    FLOOR,
    INSIDE,
    NOT_COMPARED,
    OUTSIDE,
    headline,
    judge,
    run_check,
    smooth,
    window_for,
)
from pytorchtricks.tune.config import TuneConfig
from pytorchtricks.tune.console import summary_lines
from pytorchtricks.tune.engine import tune_model
from pytorchtricks.tune.measuring import Progress
from pytorchtricks.tune.workload import build_workload

STEPS = (
    24  # the tiny model's loss falls by ~1 in 24 steps (a smoothing window of 2); ~1 s per pipeline and seed
)


def _rows(out: str) -> list[dict]:
    with open(os.path.join(out, "results.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


# ----------------------------------------------------------------------------------------------- the rule


def test_the_rule_on_figures():
    rng = np.random.default_rng(0)
    trend = 2.3 * np.exp(-np.arange(40) / 20)
    base = (trend + rng.normal(0, 0.05, (3, 40))).tolist()
    same = judge(base, base)  # the baseline's own runs: always inside its band
    assert same.answer == INSIDE and same.share_inside == 1.0 and same.final_inside
    assert same.window == window_for(40) == 4 and len(same.lower) == 40
    # the band is the smoothed per-step min/max, widened; the recommended line the smoothed seed mean
    sb = smooth(np.asarray(base), same.window)
    assert np.allclose(same.band_min, sb.min(0)) and np.allclose(same.band_max, sb.max(0))
    assert all(
        lo < mn <= mx < hi for lo, mn, mx, hi in zip(same.lower, same.band_min, same.band_max, same.upper)
    )
    assert np.allclose(same.recommended_mean, sb.mean(0))
    # learning slower: the loss stays higher than the band at the end
    slow = judge(base, (2.3 * np.exp(-np.arange(40) / 60) + rng.normal(0, 0.05, (3, 40))).tolist())
    assert slow.answer == OUTSIDE and "above it at the end" in slow.reason
    # inside most of the run but drifting away at the end is outside
    late = np.asarray(base).copy()
    late[:, -3:] -= 1.0
    drift = judge(base, late.tolist())
    assert drift.share_inside is not None and drift.share_inside >= 0.9 and not drift.final_inside
    assert drift.answer == OUTSIDE and "below it at the end" in drift.reason


def test_non_finite_losses_and_a_band_of_no_width():
    base = [[2.3, 2.1, 1.9, 1.8]] * 3
    nan = judge(base, [[2.3, float("nan"), float("nan"), float("nan")]] * 3)
    assert nan.answer == OUTSIDE and "non-finite at step 2" in nan.reason
    diverged = judge([[2.3, float("inf"), 1.0, 1.0], *base[1:]], base)
    assert diverged.answer == NOT_COMPARED and "baseline's own loss" in diverged.reason
    # seeds that change nothing give a band of no width: float rounding of another kernel is not a difference
    rounding = [[v * (1 + 1e-6) for v in base[0]]] * 3
    assert judge(base, rounding).answer == INSIDE
    assert judge(base, [[v * (1 + 3 * FLOOR) for v in base[0]]] * 3).answer == OUTSIDE


def test_the_rule_is_calibrated_on_simulated_runs():
    """Independent seeds (the worst case: tune pairs them) of the same pipeline pass; a shift of one per-step
    seed-to-seed standard deviation fails. 3 seeds, 50 steps, 300 simulated checks each."""
    rng = np.random.default_rng(0)
    trend = 2.3 * np.exp(-np.arange(50) / 30)

    def passes(shift: float) -> float:
        runs = [judge((trend + rng.normal(0, 0.1, (3, 50))).tolist(),
                      (trend + shift + rng.normal(0, 0.1, (3, 50))).tolist()) for _ in range(300)]  # fmt: skip
        return sum(r.answer == INSIDE for r in runs) / len(runs)

    assert passes(0.0) >= 0.9
    assert passes(0.1) <= 0.1


def test_options_are_refused_with_the_fix():
    with pytest.raises(PttError, match="accuracy_seeds=3"):
        tune_model(TuneConfig("torchvision:resnet18", "synthetic", accuracy_steps=10, accuracy_seeds=2))
    with pytest.raises(PttError, match="accuracy_steps=1 must be 0"):
        tune_model(TuneConfig("torchvision:resnet18", "synthetic", accuracy_steps=1))


def test_cli_flags_are_the_config_fields(monkeypatch):
    args = build_parser().parse_args(["tune", "--accuracy-steps", "50", "--accuracy-seeds", "4"])
    assert (args.accuracy_steps, args.accuracy_seeds) == (50, 4)
    got: dict = {}

    class Stop(Exception):
        pass

    def fake(*a, **kw):
        got.update(kw)
        raise Stop

    monkeypatch.setattr(engine, "tune_model", fake)
    with pytest.raises(Stop):
        args.handler(args)
    assert got["accuracy_steps"] == 50 and got["accuracy_seeds"] == 4
    fields = {f.name for f in dataclasses.fields(TuneConfig)}
    assert {"accuracy_steps", "accuracy_seeds"} <= fields
    assert build_parser().parse_args(["tune"]).accuracy_steps == TuneConfig().accuracy_steps == 0


# ----------------------------------------------------------------------------------------------- end to end


def _recommend(monkeypatch, names: list[str]) -> None:
    """tune recommends ``names`` (its candidate phase returns them; verify measures and keeps them), and skips
    the self-check (a fresh process: not what these tests are about)."""
    monkeypatch.setattr(engine, "_phase_candidates", lambda *a, **k: list(names))
    monkeypatch.setattr(engine, "_self_check", lambda *a, **k: None)


class _ShuffledLabels:
    """A loader wrapper that replaces every batch's labels by random ones: the model learns nothing."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for x, y in self.loader:
            yield x, torch.randint(0, 10, y.shape, generator=g)


def _lr_times_100(setup, _state):
    name, kw = setup.optimizer
    setup.optimizer = (name, {**kw, "lr": kw["lr"] * 100})


WRONG = {  # deliberately wrong tricks: (what the hook changes, its apply)
    "shuffle_labels": ("loader", lambda setup, _state: setup.device_loader.append(_ShuffledLabels)),
    "lr_times_100": ("optimizer", _lr_times_100),
}


def _inject(monkeypatch, name: str) -> None:
    """Put the wrong trick ``name`` into the catalogue's tune hooks (as an approximate trick)."""
    changes, apply = WRONG[name]
    hook = TuneHook(changes=changes, check="approximate", receipt=f"# {name}", apply=apply)
    wrong = hooks.Candidate(name, name, hook, ("train",), False, ("speed",))
    real = hooks.all_candidates
    monkeypatch.setattr(hooks, "all_candidates", lambda: (*real(), wrong))


def _config(models_file: str, data: str, out: str) -> TuneConfig:
    return TuneConfig(f"{models_file}:tiny", data, batch_size=8, input_size=16, num_workers=0, time_budget_s=4,
                      out=out, accuracy_steps=STEPS)  # fmt: skip


@pytest.mark.slow  # ~15 s: tune's diagnosis of a JPEG folder (its data doctor) before the check's 3 s
def test_a_speed_only_recommendation_learns_the_same(tmp_path, models_file, jpeg_folder, monkeypatch):
    _recommend(monkeypatch, ["to_channels_last"])
    out = str(tmp_path / "out")
    res = tune_model(_config(models_file, jpeg_folder, out))
    assert res.recommended == ("to_channels_last",)
    acc = res.accuracy
    assert acc is not None and acc.answer == INSIDE, acc.reason
    assert (acc.steps, acc.seeds) == (STEPS, 3) and np.shape(acc.baseline_losses) == (3, STEPS)
    base, rec = np.asarray(acc.baseline_losses), np.asarray(acc.recommended_losses)
    assert rec.shape == (3, STEPS)
    # one initialisation, paired seeds: every run's first loss is that of the same weights on its seed's first
    # batch (the same images, the same crops), and the seeds' batches differ
    assert np.allclose(base[:, 0], rec[:, 0], rtol=1e-5) and len({round(v, 6) for v in base[:, 0]}) == 3
    for losses in (base, rec):  # both learn: the band is a band around a falling loss, not around noise
        assert losses[:, -4:].mean() < losses[:, :4].mean() - 0.5
    row = next(r for r in _rows(out) if r["kind"] == "tune-accuracy")
    assert row["answer"] == "inside" and row["rule"] and row["baseline_losses"] == acc.baseline_losses
    html = Path(out, "report.html").read_text(encoding="utf-8")
    assert "Learns the same?" in html and "learns the same:" in html
    assert "learns the same:" in Path(out, "apply.py").read_text(encoding="utf-8")
    assert any(line.startswith("[green]learns the same[/]") for line in summary_lines(res, out))
    assert "accuracy check" in res.phase_s


@pytest.mark.parametrize(("wrong", "side"), [("shuffle_labels", "above"), ("lr_times_100", "below")])
def test_a_pipeline_that_learns_differently_is_outside(wrong, side, models_file, jpeg_folder, monkeypatch):
    """The check can fail: a trick that changes what the model learns is outside - labels shuffled (it learns
    nothing: above the band) or the learning rate x100 (on this easy task it learns faster: below the band)."""
    _inject(monkeypatch, wrong)
    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=8, input_size=16, num_workers=0)
    acc = run_check(w, (wrong,), STEPS, 3)
    assert acc.answer == OUTSIDE and f"{side} it at the end" in acc.reason, acc.reason
    assert acc.share_inside is not None and acc.share_inside < 0.5
    assert acc.approximate == [wrong] and f"without its approximate trick(s) {wrong}" in headline(acc)
    if wrong == "lr_times_100":  # the same seeds and weights: the first loss comes before the first update
        assert np.allclose(np.asarray(acc.baseline_losses)[:, 0], np.asarray(acc.recommended_losses)[:, 0])


def test_a_pipeline_that_changes_only_speed_is_inside(models_file, jpeg_folder):
    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=8, input_size=16, num_workers=0)
    acc = run_check(w, ("to_channels_last",), STEPS, 3)
    assert acc.answer == INSIDE and acc.share_inside == 1.0 and acc.approximate == [], acc.reason


def test_outside_is_said_wherever_the_recommendation_is(tmp_path, models_file, monkeypatch):
    """End to end: an outside answer flags the recommendation in the console, report.html and apply.py."""
    _inject(monkeypatch, "lr_times_100")
    _recommend(monkeypatch, ["lr_times_100"])
    out = str(tmp_path / "out")
    res = tune_model(_config(models_file, "synthetic", out))
    assert res.recommended == ("lr_times_100",)  # the recommendation stays, flagged
    assert res.accuracy is not None and res.accuracy.answer == OUTSIDE, res.accuracy.reason
    lines = summary_lines(res, out)
    assert any(ln.startswith("recommended:") and "learns differently" in ln for ln in lines)
    assert any(ln.startswith("[bold red]LEARNS DIFFERENTLY[/]") for ln in lines)
    assert "It learns differently." in Path(out, "report.html").read_text(encoding="utf-8")
    assert "WARNING - LEARNS DIFFERENTLY" in Path(out, "apply.py").read_text(encoding="utf-8")
    assert next(r for r in _rows(out) if r["kind"] == "tune-accuracy")["answer"] == "outside"


def test_nothing_recommended_has_nothing_to_compare(tmp_path, models_file, monkeypatch):
    _recommend(monkeypatch, [])
    out = str(tmp_path / "out")
    res = tune_model(_config(models_file, "synthetic", out))
    assert res.recommended == () and res.accuracy is not None and res.accuracy.answer == NOT_COMPARED
    assert "recommends the baseline itself" in res.accuracy.reason and not res.accuracy.baseline_losses
    assert "Learns the same?" in Path(out, "report.html").read_text(encoding="utf-8")


def test_inference_has_no_loss_to_compare(models_file):
    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=4, input_size=16, for_="infer")
    chk = run_check(w, ("to_channels_last",), 4, 3)
    assert chk.answer == NOT_COMPARED and "inference" in chk.reason


class _StopInCheck(Progress):
    def phase(self, name, total):
        if name.startswith("learns the same?"):
            raise KeyboardInterrupt


def test_ctrl_c_in_the_check_is_said_in_the_receipt(tmp_path, models_file, monkeypatch):
    _recommend(monkeypatch, ["to_channels_last"])
    out = str(tmp_path / "out")
    res = tune_model(_config(models_file, "synthetic", out), progress=_StopInCheck())
    assert res.interrupted and res.recommended == ("to_channels_last",)
    assert (
        res.accuracy is not None and res.accuracy.answer == NOT_COMPARED and "Ctrl-C" in res.accuracy.reason
    )
    assert next(r for r in _rows(out) if r["kind"] == "tune-accuracy")["answer"] == NOT_COMPARED
