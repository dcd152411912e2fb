"""The measuring engine: exact saved-activation bytes, interleaving, statistics, memory and fingerprint."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from pytorchtricks import clock as m
from pytorchtricks.core import PttError


def test_saved_tensor_meter_matches_closed_form_for_mlp() -> None:
    # Linear(in, h) -> ReLU -> Linear(h, out): autograd saves the input x (B*in), ReLU's output (B*h, reused by
    # the second Linear as its input: same storage, counted once). Of the weights only the second is saved (it is
    # needed for the gradient w.r.t. the ReLU output; x needs no gradient): parameters are counted apart.
    b, d_in, h, d_out = 16, 32, 64, 10
    model = nn.Sequential(nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, d_out))
    x = torch.randn(b, d_in)
    with m.SavedTensorMeter() as meter:
        model(x).sum().backward()
    assert meter.saved_bytes == 4 * (b * d_in + b * h)
    assert meter.param_bytes == 4 * (h * d_out)


def test_saved_tensor_meter_dedups_views_of_one_storage() -> None:
    x = torch.randn(8, 8, requires_grad=True)
    y = x * 2  # y is saved by nothing here; the two views below share y's storage
    with m.SavedTensorMeter() as meter:
        (y[:4].sin() + y[4:].sin()).sum()
    # sin saves its input: two views of the same storage of 64 floats count once
    assert meter.saved_bytes == 64 * 4


def test_saved_tensor_meter_scales_with_depth() -> None:
    def saved(depth: int) -> int:
        model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(depth)])
        with m.SavedTensorMeter() as meter:
            model(torch.randn(4, 16)).sum()
        return meter.saved_bytes

    # each block saves one (4, 16) fp32 tensor that is not shared: Tanh output == next Linear input
    assert saved(4) - saved(2) == 2 * 4 * 16 * 4


def test_compare_interleaves_rounds_in_rotating_order() -> None:
    calls: list[str] = []

    def make(name: str):
        def fn() -> None:
            calls.append(name)

        return fn

    cmp = m.compare(
        {"baseline": make("a"), "treated": make("b"), "peer": make("c")}, rounds=3, min_run_time_s=0.001
    )
    assert cmp.order == [
        ["baseline", "treated", "peer"],
        ["treated", "peer", "baseline"],
        ["peer", "baseline", "treated"],
    ]
    # after warm-up, the call log switches variant between blocks: no variant runs all its rounds first
    body = calls[6:]
    switches = sum(1 for x, y in zip(body, body[1:]) if x != y)
    assert switches >= 3 * 3 - 1
    assert set(cmp.variants) == {"baseline", "treated", "peer"}
    assert cmp["baseline"].ratio == pytest.approx(1.0)


def test_compare_detects_a_real_difference() -> None:
    big = torch.randn(300, 300)
    small = torch.randn(30, 30)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # no intra-op barrier: on a loaded machine OpenMP spin-waits can swamp a small matmul
    try:
        cmp = m.compare(
            {"baseline": lambda: big @ big, "treated": lambda: small @ small}, rounds=3, min_run_time_s=0.02
        )
    finally:
        torch.set_num_threads(threads)
    assert cmp["treated"].ratio > 1.0
    assert cmp["treated"].ratio_q1 <= cmp["treated"].ratio <= cmp["treated"].ratio_q3


def test_compare_settle_keeps_a_slow_start_out_of_the_timed_rounds() -> None:
    """A variant slow for its first calls (halving each call: allocator growth, primitive caches) is called until
    two calls agree before the rounds start; without ``settle`` its first round times the slow calls."""
    import time

    def slow_start():
        calls = iter([0.16, 0.08, 0.04, 0.02])

        def fn() -> None:
            time.sleep(next(calls, 0.005))

        return fn

    def first_round_s(settle: int) -> tuple[float, int]:
        cmp = m.compare(
            {"baseline": lambda: time.sleep(0.005), "treated": slow_start()},
            rounds=3, min_run_time_s=0.001, warmup=1, settle=settle,
        )  # fmt: skip
        return cmp["treated"].stats.times_s[0], cmp["treated"].stats.n

    settled, n = first_round_s(settle=6)
    assert n == 3 and settled < 0.012  # the steady 5 ms (sleep overshoots by well under 7 ms)
    unsettled, _ = first_round_s(settle=0)
    assert unsettled >= 0.02  # the check can fail: the slow calls land in the first round


def test_compare_rejects_missing_baseline() -> None:
    with pytest.raises(ValueError, match="baseline"):
        m.compare({"a": lambda: None})


def test_stats_quartiles() -> None:
    s = m.Stats.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.q1_s, s.median_s, s.q3_s) == (2.0, 3.0, 4.0)
    assert s.iqr_s == 2.0
    with pytest.raises(ValueError):
        m.Stats.of([])


def test_cpu_tracked_peak_is_exact_for_known_allocations() -> None:
    def fn() -> torch.Tensor:
        a = torch.empty(1000, 250)  # 1,000,000 bytes
        b = torch.empty(500, 250)  # 500,000 bytes, peak 1.5 MB
        del a
        c = torch.empty(100, 250)  # 100,000 bytes, live 600,000
        return b.sum() + c.sum()

    res = m.peak_memory(fn, "cpu")
    assert res.method == "cpu_tracked"
    assert 1_500_000 <= res.peak_bytes <= 1_500_000 + 4096  # the scalar results are a few bytes


def test_cpu_tracked_peak_leaves_out_frees_of_blocks_from_an_earlier_measurement() -> None:
    # The allocator remembers the size of a block allocated while a profiler ran, after that profiler stopped:
    # freed inside a later measurement, the block is reported with its size. Fresh blocks of 1 MB each, so the
    # true peak of the second measurement is 1 MB whatever the first one left behind.
    kept: list[torch.Tensor] = []
    m.peak_memory(lambda: kept.extend(torch.ones(250_000) for _ in range(4)), "cpu")  # 4 MB allocated, kept

    def fn() -> None:
        kept.clear()  # frees the 4 MB of the earlier measurement inside this one
        torch.ones(250_000).sum()

    assert m.peak_memory(fn, "cpu").peak_bytes >= 1_000_000  # replayed naively: -4 MB + 1 MB, a peak of 0


def test_rss_subprocess_reports_resident_memory() -> None:
    res = m.rss_peak_subprocess("import numpy as np\nx = np.ones(50_000_000, dtype=np.uint8)\n")
    assert res.method == "rss_subprocess"
    assert res.peak_bytes > 50_000_000


def test_stopwatch_and_deadline() -> None:
    sw = m.Stopwatch()
    with sw.stage("a"):
        sum(range(1000))
    with sw.stage("a"):
        pass
    assert sw.counts["a"] == 2 and sw.total_s >= 0
    d = m.Deadline(1e9)
    assert not d.expired and d.remaining_s > 0
    assert m.Deadline(0).expired
    assert m.Deadline(None).remaining_s == float("inf")


def test_environment_fingerprint_and_jsonl(tmp_path) -> None:
    env = m.environment("cpu")
    for key in (
        "torch",
        "cuda",
        "device",
        "device_name",
        "cpu_flags",
        "threads",
        "git_sha",
        "command",
        "time_utc",
    ):
        assert key in env
    assert env["threads"] == torch.get_num_threads()
    path = tmp_path / "sub" / "r.jsonl"
    m.write_jsonl(path, [{"a": 1, "env": env}, {"b": torch.device("cpu")}])
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["env"]["torch"] == torch.__version__
    assert json.loads(lines[1])["b"] == "cpu"


def test_write_results_replaces_the_pair(tmp_path):
    from pytorchtricks.clock import write_results

    stem = tmp_path / "sub" / "bench"
    (tmp_path / "sub").mkdir()
    write_results(stem, [{"a": 1}, {"a": 2}], "# first\n")
    write_results(stem, [{"a": 3}], "# second\n")  # a second run replaces, it does not append
    assert (tmp_path / "sub" / "bench.jsonl").read_text().splitlines() == ['{"a": 3}']
    assert (tmp_path / "sub" / "bench.md").read_text() == "# second\n"
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["bench.jsonl", "bench.md"]


def test_compare_single_call_variants_skip_warmup_and_report_per_unit() -> None:
    calls: list[str] = []
    warmed: list[str] = []

    def make(name: str):
        def fn() -> None:
            calls.append(name)

        return fn

    cmp = m.compare(
        {"baseline": make("a"), "slow": make("b")},
        rounds=3,
        min_run_time_s=0.0,
        warmup=1,
        before_block=warmed.append,
        single_call={"slow"},
        units_per_call={"slow": 4},
    )
    assert calls.count("b") == 3  # no warm-up call, one call per block (min_run_time 0)
    assert warmed.count("slow") == 3  # its before_block ran before every block
    # per unit: the recorded time is a quarter of the call's
    assert all(t >= 0 for t in cmp["slow"].stats.times_s)


def test_compare_stops_at_its_budget_after_min_rounds() -> None:
    import time as _t

    cmp = m.compare(
        {"baseline": lambda: _t.sleep(0.02), "b": lambda: _t.sleep(0.02)},
        rounds=50,
        min_run_time_s=0.0,
        warmup=0,
        budget_s=0.2,
        single_call={"baseline", "b"},
    )
    assert 3 <= cmp.rounds < 50 and len(cmp.order) == cmp.rounds


def test_compare_config_is_the_keywords_as_one_value() -> None:
    opts = {
        "rounds": 3,
        "min_run_time_s": 0.001,
        "warmup": 0,
        "single_call": ("b",),
        "units_per_call": {"b": 2},
    }

    def run(use_config: bool) -> tuple[m.Comparison, list[object]]:
        seen: list[object] = []  # the hooks' calls: which block comes next, which round ended
        variants = {"baseline": lambda: sum(range(50)), "b": lambda: 1225}
        kw = {**opts, "on_round": seen.append, "before_block": seen.append}
        if use_config:
            return m.compare(variants, m.CompareConfig(**kw)), seen
        return m.compare(variants, **kw), seen

    (by_kw, seen_kw), (by_cfg, seen_cfg) = run(False), run(True)
    assert (by_cfg.rounds, by_cfg.order, seen_cfg) == (by_kw.rounds, by_kw.order, seen_kw)
    assert by_kw.rounds == 3 and seen_kw[:3] == ["baseline", "b", 0]  # block, block, end of round 0
    with pytest.raises(PttError, match=r"not both \(got rounds, warmup too\)"):
        m.compare({"baseline": lambda: None}, m.CompareConfig(), rounds=2, warmup=0)
