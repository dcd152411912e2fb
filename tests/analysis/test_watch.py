"""`ptt.watch`: the doctor's per-step split inside the user's own loop, scoped to the objects given."""

from __future__ import annotations

import pytest
import torch

import pytorchtricks as ptt
from pytorchtricks.analysis.step_split import STAGES


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randint(0, 3, (48,)))
    loader = torch.utils.data.DataLoader(
        data, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    return model, opt, loader


def _train(model, opt, loader, other=None):
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if other is not None:  # an EMA-like second model and a second loader in the same block
            other(x)
            next(iter(other_loader))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _item_line():
    import inspect

    src, first = inspect.getsourcelines(_train)
    return first + next(i for i, line in enumerate(src) if "loss.item()" in line)


other_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 8)), batch_size=2)


def test_watch_splits_the_loop_and_changes_nothing_it_computes(tmp_path):
    plain = _train(*_setup())
    model, opt, loader = _setup()
    with ptt.watch(model, loader, opt, warmup=2) as w:
        watched = _train(model, opt, loader)
    assert watched == plain  # the hooks add time only
    r = w.report
    assert r.ended == "the block ended after 8 optimizer step(s)" and len(r.steps) == 6
    for st in r.steps:
        assert set(st) == {*STAGES, "step"} and sum(st[s] for s in STAGES) == pytest.approx(
            st["step"], rel=0.05
        )
        assert st["data wait"] > 0 and st["forward"] > 0 and st["backward"] > 0 and st["optimizer"] > 0
    assert r.loaders[0]["batch_size"] == 6 and r.loaders[0]["via"] == "DataLoader"
    assert r.model["class"] == "Sequential" and r.input_shape == [6, 8]
    assert r.optimizer["class"] == "SGD" and r.optimizer["momentum"] == 0.9
    assert dict(r.syncs) == {
        f"test_watch.py:{_item_line()} .item()": 1.0
    }  # this file's loss.item(), once per step
    assert r.verdict and r.fix and "data wait" in r.evidence
    text = w.summary()
    assert "6 measured" in text and "first fix:" in text and f"test_watch.py:{_item_line()} .item()" in text
    w.save(str(tmp_path / "out"))
    assert (tmp_path / "out" / "results.jsonl").exists() and "Verdict:" in (
        tmp_path / "out" / "report.html"
    ).read_text()


def test_watch_times_only_the_objects_it_was_given():
    model, opt, loader = _setup()
    ema = torch.nn.Linear(8, 3)
    with ptt.watch(model, loader, opt, warmup=0) as w:
        _train(model, opt, loader, other=ema)
    r = w.report
    assert r.model["class"] == "Sequential" and len(r.loaders) == 1 and r.loaders[0]["batch_size"] == 6
    with ptt.watch(warmup=0) as every:  # nothing given: every model and loader the block uses
        _train(model, opt, loader, other=ema)
    assert len(every.report.loaders) == 2


def test_watch_as_a_decorator_and_its_errors():
    model, opt, loader = _setup()
    w = ptt.watch(model, loader, opt, warmup=1)

    @w
    def epoch():
        return _train(model, opt, loader)

    assert len(epoch()) == 8 and len(w.report.steps) == 7
    epoch()  # a second call records afresh
    assert len(w.report.steps) == 7
    with pytest.raises(RuntimeError, match="after the `with` block ends"):
        ptt.watch().summary()
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        ptt.watch(warmup=-1)
    # the hooks are gone after the block: a later step is not recorded anywhere
    _train(model, opt, loader)
    assert len(w.report.steps) == 7
