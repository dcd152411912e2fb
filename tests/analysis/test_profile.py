"""ptt.profile: the step split, the verdict on input-bound and compute-bound toy loops, trace size guard."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.analysis.profile import SEGMENTS, _verdict, bf16_native
from pytorchtricks.core import PttError

pytestmark = pytest.mark.usefixtures("one_thread")  # the root conftest's fixture


def _train_step(model: nn.Module) -> tuple[torch.optim.Optimizer, object]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return opt, step


def test_input_bound_loop_says_input_bound() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    _, step = _train_step(model)

    def slow_reader() -> Iterator[torch.Tensor]:
        while True:
            time.sleep(0.03)  # a slow disk / decoder: the model waits for every batch
            yield torch.randn(8, 16)

    rep = ptt.profile(step, steps=4, data=slow_reader(), warmup=1, profile_steps=0, hotspot_steps=0)
    assert rep.verdict == "input-bound", str(rep)
    assert rep.split_s["data"] >= 0.025
    assert "make_loader" in rep.line()


def test_compute_heavy_loop_says_compute_bound_and_splits_the_step() -> None:
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
    _, step = _train_step(model)
    batch = torch.randn(256, 512)
    rep = ptt.profile(step, steps=3, data=[batch], warmup=1, profile_steps=1, hotspot_steps=1, top=5)
    assert rep.verdict == "compute-bound", str(rep)
    assert rep.split_s["forward"] > 0 and rep.split_s["backward"] > rep.split_s["forward"] * 0.5
    assert rep.split_s["optimizer"] > 0 and rep.split_s["h2d"] == 0 and rep.split_s["sync"] == 0
    assert any("mm" in r["name"] for r in rep.top_ops[:3]), rep.top_ops
    assert rep.hotspots and all({"function", "calls", "tottime_ms"} <= set(r) for r in rep.hotspots)
    # the bf16 tip only where bf16 is native (test_bf16_tip_only_where_bf16_is_native covers both)
    assert ("mixed_precision" in str(rep)) is bf16_native(torch.device("cpu"))


def test_verdict_rules() -> None:
    base = dict.fromkeys(SEGMENTS, 0.0)
    assert _verdict({**base, "data": 0.5, "forward": 0.5}) == "input-bound"
    assert _verdict({**base, "sync": 0.3, "forward": 0.7}) == "sync-bound"
    assert _verdict({**base, "forward": 0.2, "backward": 0.3, "other": 0.1}) == "compute-bound"
    assert _verdict({**base, "other": 0.8, "forward": 0.2}) == "overhead-bound"


def test_trace_export_and_size_guard(tmp_path: object) -> None:
    model = nn.Linear(32, 32)
    _, step = _train_step(model)
    path = os.path.join(str(tmp_path), "trace.json")
    rep = ptt.profile(
        step, steps=1, data=[torch.randn(4, 32)], profile_steps=1, hotspot_steps=0, trace_path=path
    )
    assert rep.trace_path == path
    with open(path, encoding="utf-8") as fh:
        assert any("addmm" in e.get("name", "") for e in json.load(fh)["traceEvents"])
    size = os.path.getsize(path)
    small = os.path.join(str(tmp_path), "small.json")
    rep = ptt.profile(
        step, steps=1, data=[torch.randn(4, 32)], profile_steps=1, hotspot_steps=0, trace_path=small,
        max_trace_bytes=size // 2,
    )  # fmt: skip
    if rep.trace_path is not None:  # gzipped under the limit
        assert rep.trace_path.endswith(".gz") and os.path.getsize(rep.trace_path) <= size // 2
        with gzip.open(rep.trace_path) as fh:
            json.load(fh)
    else:
        assert "dropped" in rep.notes[0]
    assert not os.path.exists(small)
    rep = ptt.profile(
        step,
        steps=1,
        data=[torch.randn(4, 32)],
        profile_steps=1,
        hotspot_steps=0,
        trace_path=small,
        max_trace_bytes=10,
    )
    assert rep.trace_path is None and "dropped" in rep.notes[0]
    assert not [f for f in os.listdir(str(tmp_path)) if f.endswith(".tmp")]  # no temp files left behind


def test_misuse() -> None:
    with pytest.raises(PttError, match="callable"):
        ptt.profile("step")  # type: ignore[arg-type]
    with pytest.raises(PttError, match="steps"):
        ptt.profile(lambda: None, steps=0)
    with pytest.raises(PttError, match="empty"):
        ptt.profile(lambda b: None, steps=1, data=[], warmup=0, profile_steps=0, hotspot_steps=0)
    rep = ptt.profile(lambda: None, steps=2, warmup=0, profile_steps=0, hotspot_steps=0)  # no data: step_fn()
    assert rep.split_s["data"] >= 0 and rep.steps == 2


@pytest.mark.isa
@pytest.mark.parametrize("native", [False, True])
def test_bf16_tip_only_where_bf16_is_native(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    import pytorchtricks.analysis.profile as prof
    from pytorchtricks.hardware import caps_from

    flags = {"avx2", "fma"} | ({"avx512f", "avx512bw", "avx512_bf16"} if native else set())
    monkeypatch.setattr(prof, "cpu_caps", lambda: caps_from("test cpu", flags, {}))
    tip, note = prof.first_trick("compute-bound", torch.device("cpu"))
    assert ("bf16" in tip) is native and "ptt.compile_" in tip
    assert note is None if native else "no native bf16" in str(note)
    assert "bf16" not in prof.first_trick("input-bound", torch.device("cpu"))[0]
    # and the report says it: a compute-bound step on an AVX2-only CPU gets no bf16 tip, and a note why
    monkeypatch.setattr(prof, "_verdict", lambda split: "compute-bound")
    _, step = _train_step(nn.Linear(64, 64))
    rep = ptt.profile(
        step, steps=2, data=[torch.randn(8, 64)], profile_steps=0, hotspot_steps=0, device="cpu"
    )
    assert ("mixed_precision" in str(rep)) is native and any(
        "no native bf16" in n for n in rep.notes
    ) is not native


@pytest.mark.isa
def test_bf16_tip_on_cuda_follows_is_bf16_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytorchtricks.analysis.profile as prof

    for supported in (False, True):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert ("bf16" in prof.first_trick("compute-bound", torch.device("cuda"))[0]) is supported


def test_config_is_the_keywords_as_one_value() -> None:
    def run(*config: ptt.ProfileConfig, **kw: object) -> tuple[ptt.ProfileReport, int]:
        calls = []
        rep = ptt.profile(lambda x: calls.append(x.sum()), 3, *config, data=[torch.ones(2, 4)], **kw)
        return rep, len(calls)

    opts = {"warmup": 1, "profile_steps": 1, "hotspot_steps": 1, "top": 3, "device": "cpu"}
    (by_kw, n_kw), (by_cfg, n_cfg) = run(**opts), run(ptt.ProfileConfig(**opts))
    assert n_kw == n_cfg == 1 + 3 + (1 + 1) + 1  # warm-up, timed, profiler (its warm-up + active), hotspots
    assert by_cfg.steps == by_kw.steps == 3 and sorted(by_cfg.split_s) == sorted(by_kw.split_s)
    for rep in (by_kw, by_cfg):  # top=3 caps both tables; no trace_path, no trace
        assert len(rep.top_ops) <= 3 and 0 < len(rep.hotspots) <= 3 and rep.trace_path is None
    with pytest.raises(PttError, match=r"not both \(got top, warmup too\)"):
        run(ptt.ProfileConfig(), warmup=0, top=5)
