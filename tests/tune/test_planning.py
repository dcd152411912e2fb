"""How tune plans and orders its measurements: per-variant cost plans, the sweep that tunes what the others built,
ties inside an exclusive group, and the one-time state kept per configuration it was built on."""

from __future__ import annotations

import pytest

from pytorchtricks.tune import engine
from pytorchtricks.tune.hooks import by_name
from pytorchtricks.tune.measuring import Measured, plan_blocks
from pytorchtricks.tune.runner import prepare_key


def _m(name: str, ratio: float, q1: float, q3: float) -> Measured:
    return Measured(
        name, (name,), 1 / ratio, 1 / ratio, 1 / ratio, 32 * ratio, ratio, q1, q3, 3, None, None, "step"
    )


def test_plan_blocks_fits_more_rounds_into_more_time_and_refuses_what_cannot_fit():
    steps = {"baseline": 1.0, "cache_in_ram": 0.3}
    short = plan_blocks(steps, set(steps), 20.0, memory=False, whole_units=2)
    long = plan_blocks(steps, set(steps), 120.0, memory=False, whole_units=2)
    assert short is not None and long is not None and long[0] > short[0]
    assert plan_blocks(steps, set(steps), 5.0, memory=False, whole_units=2) is None
    # a call of a whole-step variant is one step per loader worker: two workers cost twice as much time
    assert plan_blocks(steps, set(steps), 20.0, memory=False, whole_units=4) is None


def test_the_loader_sweep_is_tried_after_every_other_winner():
    assert by_name("autotune_loader").hook.last and not by_name("cache_in_ram").hook.last
    meas = {
        "autotune_loader": _m("autotune_loader", 5.0, 4.9, 5.1),
        "cache_in_ram": _m("cache_in_ram", 3.0, 2.9, 3.1),
    }
    ranked = sorted(meas, key=lambda n: (by_name(n).hook.last, -round(meas[n].ratio, 2), n))
    assert ranked == ["cache_in_ram", "autotune_loader"]


@pytest.mark.parametrize(
    ("pack", "expected_first"),
    [
        ((3.4, 3.2, 3.5), "cache_in_ram"),  # a tie within the spread: the lower-order hook (the RAM cache)
        ((5.0, 4.8, 5.2), "pack[resize]"),  # clearly better: its first quartile above the cache's median
    ],
)
def test_ties_inside_an_exclusive_group_go_to_the_lower_order_hook(pack, expected_first):
    meas = {"pack[resize]": _m("pack[resize]", *pack), "cache_in_ram": _m("cache_in_ram", 3.3, 3.1, 3.5)}
    ranked = sorted(meas, key=lambda n: -meas[n].ratio)
    assert engine._group_ties_first(ranked, meas)[0] == expected_first


def test_a_sweep_over_a_cache_is_kept_apart_from_the_sweep_over_the_files():
    assert prepare_key("autotune_loader", ("make_loader",)) == "autotune_loader"
    assert (
        prepare_key("autotune_loader", ("cache_in_ram", "make_loader")) == "autotune_loader on cache_in_ram"
    )
    assert prepare_key("cache_in_ram", ("to_channels_last",)) == "cache_in_ram"  # model tricks do not matter


def test_one_time_builds_say_what_they_leave_and_a_sweep_over_a_cache_is_its_own(
    tmp_path, models_file, jpeg_folder, monkeypatch
):
    from pytorchtricks.tricks.data.cache_in_ram import remove_arenas
    from pytorchtricks.tune.runner import prepare_all
    from pytorchtricks.tune.workload import build_workload

    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path / "cache"))
    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=4, input_size=16)
    arena = None
    try:
        prepare_all(w, ("pack",))
        # where it stays and how to remove it
        assert any("tune-pack-" in n and "rm -r" in n for n in w.run.notes)
        prepare_all(w, ("cache_in_ram", "autotune_loader"))
        arena = w.run.prepared["cache_in_ram"]
        assert any(arena.path in n for n in w.run.notes)  # the arena in /dev/shm, said with its size
        # the sweep over the cache is another sweep than the one over the files, timed with the step beside
        assert "autotune_loader on cache_in_ram" in w.run.prepared and "autotune_loader" not in w.run.prepared
        assert any(
            n.startswith("autotune_loader on cache_in_ram: swept with the training step") for n in w.run.notes
        )
        assert {"num_workers", "pin_memory"} <= set(w.run.prepared["autotune_loader on cache_in_ram"])
    finally:
        if arena is not None:
            remove_arenas([arena.path])


def test_dataset_on_device_skips_on_cpu_and_its_configuration_is_checked_and_runs(
    tmp_path, models_file, jpeg_folder, monkeypatch
):
    """On CUDA tune measures it; on this CPU it is listed with the reason. The configuration itself (decode once,
    resident tensors, batches cropped where they live) runs and passes tune's data check on any device."""
    import torch

    from pytorchtricks.tunable import TuneFacts
    from pytorchtricks.tune.candidates import check, why_not
    from pytorchtricks.tune.runner import Runner, prepare_all
    from pytorchtricks.tune.workload import build_workload

    cand = by_name("dataset_on_device")
    assert "CPU" in why_not(cand, TuneFacts(device="cpu", verdict="input-bound", data_kind="files"))
    assert why_not(cand, TuneFacts(device="cuda", verdict="input-bound", data_kind="files")) is None
    assert cand.hook.group == by_name("cache_in_ram").hook.group  # one of the tricks that replace the dataset
    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path / "cache"))
    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=4, input_size=16)
    prepare_all(w, ("dataset_on_device",))
    state = w.run.prepared["dataset_on_device"]
    n = len(w.dataset)
    assert (
        state["images"].shape == (n, 3, state["side"], state["side"]) and state["images"].dtype == torch.uint8
    )
    chk = check(w, ("dataset_on_device",))
    assert chk.passed, chk.detail
    assert f"{n} samples once each" in chk.detail and chk.metrics["psnr_db"] >= 30
    r = Runner(w, ("dataset_on_device",))
    try:
        x, y = r.next_batch()
        assert x.shape == (4, 3, 16, 16) and x.dtype == torch.uint8 and y.shape == (4,)
        assert r.step() is not None  # the training step on a batch cropped where the images live
    finally:
        r.close()
