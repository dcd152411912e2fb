"""The convergence benchmark's arithmetic on known inputs: time to a target mAP and Welch's t-test (its p checked
against the t distribution in closed form and from tables)."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest

_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "_convergence_stats.py"
)
_spec = importlib.util.spec_from_file_location("_convergence_stats", _PATH)
assert _spec is not None and _spec.loader is not None
stats = importlib.util.module_from_spec(_spec)
sys.modules["_convergence_stats"] = stats
_spec.loader.exec_module(stats)


def test_time_to_interpolates_between_checkpoints() -> None:
    pts = [(10.0, 0.1), (20.0, 0.3), (30.0, 0.5)]
    assert stats.time_to(pts, 0.2) == pytest.approx(15.0)
    assert stats.time_to(pts, 0.5) == pytest.approx(30.0)
    assert stats.time_to(pts, 0.05) == pytest.approx(5.0)  # from the start (0 s, mAP 0)


def test_time_to_takes_the_first_crossing_and_none_when_never_reached() -> None:
    assert stats.time_to([(10.0, 0.4), (20.0, 0.2), (30.0, 0.4)], 0.3) == pytest.approx(7.5)
    assert stats.time_to([(10.0, 0.1), (20.0, 0.2)], 0.3) is None
    assert stats.time_to([], 0.1) is None


def test_betainc_matches_closed_forms() -> None:
    assert stats.betainc(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert stats.betainc(2.0, 1.0, 0.5) == pytest.approx(0.25)  # x^2
    assert stats.betainc(0.5, 0.5, 0.5) == pytest.approx(0.5)  # symmetric
    assert stats.betainc(3.0, 2.0, 0.0) == 0.0 and stats.betainc(3.0, 2.0, 1.0) == 1.0


def test_welch_against_the_t_distribution_in_closed_form() -> None:
    # n = 2 a side with equal variances: df = 2, where the two-sided p is 1 - |t| / sqrt(2 + t^2)
    r = stats.welch([0.0, 2.0], [2.0, 4.0])
    assert r["t"] == pytest.approx(-math.sqrt(2.0)) and r["df"] == pytest.approx(2.0)
    assert r["p"] == pytest.approx(1 - math.sqrt(2.0) / 2.0)
    assert r["diff"] == pytest.approx(-2.0) and r["cohen_d"] == pytest.approx(-2.0 / math.sqrt(2.0))
    # two-sided p of t = 2 at df = 10 is 0.0734 (t tables): I_{df/(df+t^2)}(df/2, 1/2)
    assert stats.betainc(5.0, 0.5, 10 / (10 + 4.0)) == pytest.approx(0.07339, abs=1e-4)


def test_welch_equal_samples_and_too_few() -> None:
    r = stats.welch([0.3, 0.31, 0.29], [0.3, 0.31, 0.29])
    assert r["t"] == 0.0 and r["p"] == pytest.approx(1.0) and r["cohen_d"] == 0.0
    far = stats.welch([0.30, 0.31, 0.29], [0.50, 0.51, 0.49])
    assert far["p"] < 1e-3 and far["cohen_d"] == pytest.approx(-20.0)
    with pytest.raises(ValueError, match="2 values"):
        stats.welch([0.3], [0.3, 0.4])
