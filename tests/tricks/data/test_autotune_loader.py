"""autotune_loader: measures the grid within its budget, returns the fastest row, falls back when the cache is refused."""

from __future__ import annotations

import pytest

from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.tricks.data.autotune_loader import AutotuneConfig, autotune_loader
from pytorchtricks.tricks.data.cache_in_ram import CacheConfig, CachedDataset
from pytorchtricks.tricks.data.make_loader import _photo_bytes


@pytest.fixture(scope="module")
def jpegs():
    return _photo_bytes(48, (60, 80))


def test_sweeps_the_grid_and_returns_the_fastest_row(jpegs, tmp_path):
    r = autotune_loader(
        jpegs,
        8,
        crop=32,
        workers=(0, 1),
        prefetch_factors=(2,),
        cache=(False, True),
        batches=2,
        cache_size=48,
        cache_dir=str(tmp_path),
        num_workers=0,
    )
    timed = [row for row in r.table if "images_per_s" in row]
    assert {(row["cache"], row["num_workers"]) for row in timed} == {
        (False, 0),
        (False, 1),
        (True, 0),
        (True, 1),
    }
    best = max(timed, key=lambda row: row["images_per_s"])
    assert r.best["num_workers"] == best["num_workers"] and r.cache == best["cache"]
    assert isinstance(r.dataset, CachedDataset) == r.cache and r.cache_build_s is not None
    x, _ = next(iter(r.loader(8)))
    assert x.shape == (8, 3, 32, 32)


def test_budget_stops_the_sweep_after_one_setting(jpegs):
    with pytest.warns(NoEffectWarning, match="one setting"):
        r = autotune_loader(jpegs, 8, crop=32, workers=(0, 1, 2), cache=(False,), budget_s=0, batches=1)
    assert len(r.table) == 1


def test_refused_cache_is_reported_not_used(jpegs, tmp_path):
    r = autotune_loader(
        jpegs,
        8,
        crop=32,
        workers=(0, 1),
        cache=(False, True),
        batches=1,
        budget=10,
        cache_dir=str(tmp_path),
    )
    assert any("skipped" in row for row in r.table) and not r.cache


def test_misuse():
    with pytest.raises(PttError, match="at least"):
        autotune_loader(_photo_bytes(4), 8)


def test_the_step_runs_beside_the_loader_on_every_batch(jpegs):
    seen: list[tuple[int, ...]] = []

    def step(x, y):
        seen.append(tuple(x.shape))

    r = autotune_loader(
        jpegs, 8, crop=32, workers=(0, 1), prefetch_factors=(2,), cache=(False,), batches=2, step=step
    )
    timed = [row for row in r.table if "images_per_s" in row]
    assert len(timed) == 2 and all(row["with_step"] for row in timed)
    # each setting: its warm-up batch and the timed ones, all through the step
    assert len(seen) == 2 * (1 + 2) and set(seen) == {(8, 3, 32, 32)}


def test_worker_counts_come_before_other_prefetch_factors(jpegs):
    r = autotune_loader(
        jpegs, 8, crop=32, workers=(0, 1, 2), prefetch_factors=(2, 4), cache=(False,), batches=1
    )
    order = [(row["num_workers"], row["prefetch_factor"]) for row in r.table]
    assert order[:3] == [(0, None), (1, 2), (2, 2)]


@pytest.mark.filterwarnings(
    "ignore::pytorchtricks.core.NoEffectWarning", "ignore::pytorchtricks.core.PttWarning"
)
def test_config_is_the_keywords_as_one_value(jpegs, tmp_path):
    opts = {"crop": 32, "workers": (0,), "prefetch_factors": (2,), "pin_memory": (False,), "batches": 1}
    cache = {"cache_dir": str(tmp_path), "num_workers": 0}
    by_kw = autotune_loader(jpegs, 8, **opts, cache=(True,), cache_size=40, **cache)
    cfg = AutotuneConfig(**opts, cache=(True,), cache_size=40, cache_config=CacheConfig(**cache))
    by_cfg = autotune_loader(jpegs, 8, cfg)
    best = {"crop": 32, "num_workers": 0, "prefetch_factor": None, "pin_memory": False}
    assert by_cfg.best == by_kw.best == best
    assert by_cfg.cache and by_kw.cache and by_cfg.dataset.path == by_kw.dataset.path  # one arena
    assert [sorted(r) for r in by_cfg.table] == [sorted(r) for r in by_kw.table]
    with pytest.raises(PttError, match=r"not both \(got batches, crop too\)"):
        autotune_loader(jpegs, 8, cfg, crop=64, batches=2)
    with pytest.raises(PttError, match=r"cache_in_ram's options \(cache_dir\)"):
        autotune_loader(jpegs, 8, cfg, cache_dir=str(tmp_path))
    with pytest.raises(PttError, match=r"unknown keywords \['cache_dri'\] \(did you mean 'cache_dir'\?\)"):
        autotune_loader(jpegs, 8, cache=(False,), cache_dri=str(tmp_path))
