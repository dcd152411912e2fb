from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import pytorchtricks as ptt


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_same_seed_same_numbers_from_every_source() -> None:
    with ptt.seed_everything(42):
        a = _draw()
    with ptt.seed_everything(42):
        b = _draw()
    with ptt.seed_everything(43):
        c = _draw()
    assert a == b
    assert a[0] != c[0] and a[1] != c[1] and a[2] != c[2]


def test_with_restores_global_rng_states() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = _draw()
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    with ptt.seed_everything(7):
        _draw()
    assert _draw() == expected


def test_rejects_bad_seeds() -> None:
    for bad in (-1, 2**32, 1.5, "3", True):
        with pytest.raises(ValueError, match="seed must be an integer"):
            ptt.seed_everything(bad)  # type: ignore[arg-type]


def test_pythonhashseed_reaches_children_but_not_this_process(monkeypatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    before = hash("pytorchtricks")
    code = "print(hash('pytorchtricks'))"
    with ptt.seed_everything(5):
        assert os.environ["PYTHONHASHSEED"] == "5"
        # this process: unchanged (the interpreter read PYTHONHASHSEED at start-up)
        assert hash("pytorchtricks") == before
        # children started now inherit it: two of them agree with each other
        outs = {
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
            for _ in range(2)
        }
        assert len(outs) == 1
    assert "PYTHONHASHSEED" not in os.environ


def test_seed_worker_gives_reproducible_distinct_worker_streams() -> None:
    class Draws(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> tuple[float, float]:
            return float(np.random.rand()), random.random()

    def epoch() -> list[tuple[float, float]]:
        loader = torch.utils.data.DataLoader(
            Draws(),
            batch_size=None,
            num_workers=2,
            worker_init_fn=ptt.seed_worker,
            generator=ptt.seeded_generator(0),
        )
        return [tuple(map(float, x)) for x in loader]

    first, second = epoch(), epoch()
    assert first == second
    assert len(set(first)) == 4  # the two workers do not share a stream


def test_seeded_generator() -> None:
    g1, g2 = ptt.seeded_generator(9), ptt.seeded_generator(9)
    assert torch.equal(torch.randperm(10, generator=g1), torch.randperm(10, generator=g2))


def test_bench_case_runs_and_treated_is_seeded() -> None:
    from pytorchtricks.tricks.runtime.seed_everything import bench_case

    case = bench_case("smoke")
    torch.testing.assert_close(case.treated(), case.treated())
    case.baseline()
