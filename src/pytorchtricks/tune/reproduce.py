"""``python apply.py --check``: a receipt reproduces itself.

The receipt records how its workload was built (``workload.rebuild``: the model and data arguments, batch, input
shape, workers). ``check_receipt`` rebuilds it, runs the baseline and the recommended configuration in interleaved
rounds on the whole step (loader included) and compares the measured ratio with the receipt's (+-20%).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pytorchtricks.core import PttError

TOLERANCE = (
    0.20  # the reproduced ratio within +-20% of the receipt's: run-to-run spread on a shared 2-core box
)
PEAK_TOLERANCE = (
    0.10  # a memory receipt's peak within +-10%: the same allocations, give or take the allocator
)


def check_receipt(path: str, *, steps: int = 3, rounds: int = 5, budget_s: float = 90.0) -> dict[str, Any]:
    """Rebuild the workload of the receipt at ``path`` (receipt.json) and re-measure baseline vs recommended."""
    from pytorchtricks.tune.measuring import measure_variants
    from pytorchtricks.tune.runner import Runner
    from pytorchtricks.tune.workload import build_workload

    with open(path, encoding="utf-8") as fh:
        p = json.load(fh)
    rb = p["workload"].get("rebuild")
    if rb is None:
        raise PttError(f"{path} has no rebuild record (written by an older ptt tune); rerun ptt tune.")
    rec = tuple(p.get("recommended") or ())
    if not rec:
        raise PttError("the receipt recommends nothing: there is no speed-up to reproduce.")
    # a script's own model (older receipts say so only by naming the script): model None alone is the default
    if rb.get("model_object") or ("model_object" not in rb and p["workload"].get("script")):
        raise PttError(
            "this receipt was made from a script's own model (ptt doctor run --tune): rerun that command to "
            "re-measure it"
        )
    opt = rb.get("optimizer")
    w = build_workload(
        rb["model"], rb["data"], batch_size=rb["batch_size"], input_shape=tuple(rb["input_shape"]),
        num_workers=rb["num_workers"], for_=rb["for"], device=rb["device"],
        optimizer=(opt[0], opt[1]) if opt else None, device_step_ms=rb.get("device_step_ms"),
        task=rb.get("task", "classification"), split=rb.get("split"),
    )  # fmt: skip
    if p.get("memory"):
        return _check_memory(p, w, rec, budget_s)
    probe = Runner(w, ())
    try:
        from pytorchtricks.clock import time_call

        probe.step()
        _, step_s = time_call(probe.step, w.device)
    finally:
        probe.close()
    want_s = float((p.get("combined") or {}).get("median_s") or step_s)
    meas, _ = measure_variants(
        w,
        {"baseline": (), "recommended": rec},
        step_s={"baseline": step_s, "recommended": want_s},
        budget_s=budget_s,
        memory=True,
        min_block_s=steps * want_s,  # every timed block >= ``steps`` steps of the recommended configuration
    )
    r = _speed_result(rec, meas, p["combined"])
    return r | {
        "baseline_peak_bytes": meas["baseline"].peak_bytes,
        "recommended_peak_bytes": meas["recommended"].peak_bytes,
    }


def _speed_result(rec: tuple[str, ...], meas: dict[str, Any], want: dict[str, Any] | None) -> dict[str, Any]:
    """The re-measured speed of ``rec`` against the receipt's (``reproduced``: within ``TOLERANCE``)."""
    got = meas["recommended"]
    return {
        "recommended": list(rec),
        "baseline_images_per_s": meas["baseline"].items_per_s,
        "recommended_images_per_s": got.items_per_s,
        "ratio": got.ratio,
        "ratio_q1": got.ratio_q1,
        "ratio_q3": got.ratio_q3,
        "receipt_ratio": None if want is None else float(want["ratio"]),
        "reproduced": want is not None and abs(got.ratio / float(want["ratio"]) - 1) <= TOLERANCE,
    }


def _check_memory(p: dict[str, Any], w: Any, rec: tuple[str, ...], budget_s: float) -> dict[str, Any]:
    """A memory receipt: the recommended configuration's peak (held + the step's own) and its speed on the
    compute step, interleaved with the baseline, as the search measured them."""
    from pytorchtricks.tune.memory import measure_peak, speed_run
    from pytorchtricks.tune.runner import stage_batches

    mem = p["memory"]
    w.run.activation_budget_bytes = mem.get("activation_budget_bytes")  # the plan the search made, made again
    batches = stage_batches(w)
    base_peak, _, _, _ = measure_peak(w, (), batches)
    got_peak, _, _, err = measure_peak(w, rec, batches)
    if got_peak is None:
        raise PttError(f"the recommended configuration does not run here: {err}")
    step = (p.get("baseline") or {}).get("median_s") or 0.5
    meas = speed_run(
        w, {"recommended": rec}, batches, step, budget_s
    )  # what the search measured, the same way
    r = _speed_result(rec, meas, p["combined"])
    want_peak = next((pt["peak_bytes"] for pt in mem["points"] if tuple(pt["tricks"]) == rec), None)
    peak_ok = want_peak is not None and abs(got_peak / want_peak - 1) <= PEAK_TOLERANCE
    fits = mem.get("budget_bytes") is None or got_peak <= mem["budget_bytes"]
    return r | {
        "baseline_peak_bytes": base_peak,
        "recommended_peak_bytes": got_peak,
        "receipt_peak_bytes": want_peak,
        "fits": fits,
        "reproduced": r["reproduced"] and peak_ok and fits,
    }


def main(receipt: str, argv: list[str]) -> int:
    """The ``apply.py`` command line: ``--check [--steps N]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="apply.py", description="re-measure this receipt's recommendation")
    ap.add_argument(
        "--check", action="store_true", help="rebuild the workload, measure baseline vs recommended"
    )
    ap.add_argument("--steps", type=int, default=3, help="steps per timed block (default 3)")
    args = ap.parse_args(argv)
    if not args.check:
        ap.print_help()
        return 0
    from pytorchtricks.quiet import import_cpp_extension_quietly

    import_cpp_extension_quietly()  # torch.utils.benchmark's import warns about CUDA_HOME on a driverless box
    with open(receipt, encoding="utf-8") as fh:
        kind = json.load(fh).get("kind")
    if kind == "ultralytics":
        return _main_yolo(receipt)
    try:
        r = check_receipt(receipt, steps=args.steps)
    except PttError as exc:
        print(f"apply.py --check: {exc}")
        return 2

    def mib(b: int | None) -> str:
        return "-" if b is None else f"{b / 2**20:.0f} MiB"

    want = r["receipt_ratio"]
    print(f"recommended: {' + '.join(r['recommended'])}")
    print(f"baseline     {r['baseline_images_per_s']:.1f} images/s, peak {mib(r['baseline_peak_bytes'])}")
    print(
        f"recommended  {r['recommended_images_per_s']:.1f} images/s, peak {mib(r['recommended_peak_bytes'])}"
    )
    if "receipt_peak_bytes" in r:
        print(
            f"peak         {mib(r['recommended_peak_bytes'])}; the receipt measured {mib(r['receipt_peak_bytes'])}"
            + ("" if r["fits"] else " - ABOVE the budget")
        )
    print(
        f"speed-up     {r['ratio']:.2f}x (IQR {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}); the receipt measured "
        + (f"{want:.2f}x" if want is not None and math.isfinite(want) else "-")
        + (
            " - reproduced within 20%" + (" (peak within 10%)" if "receipt_peak_bytes" in r else "")
            if r["reproduced"]
            else " - NOT reproduced (speed within 20%"
            + (", peak within 10%" if "receipt_peak_bytes" in r else "")
            + ")"
        )
    )
    return 0 if r["reproduced"] else 1


def _main_yolo(receipt: str) -> int:
    """``python apply.py --check`` of an Ultralytics receipt (``tune.yolo``): its candidates measured again."""
    from pytorchtricks.tune.yolo import check_yolo

    with open(receipt, encoding="utf-8") as fh:
        p = json.load(fh)
    try:
        r = check_yolo(p)
    except PttError as exc:
        print(f"apply.py --check: {exc}")
        return 2
    r["reproduced"] = abs(r["ratio"] - r["receipt_ratio"]) <= TOLERANCE * r["receipt_ratio"]
    print(f"candidate    {r['candidate']}")
    print(f"stock        {r['stock_images_per_s']:.1f} images/s through its dataset and loader")
    print(f"{r['candidate']:<12} {r['images_per_s']:.1f} images/s")
    print(
        f"speed-up     {r['ratio']:.2f}x (IQR {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}); the receipt measured "
        f"{r['receipt_ratio']:.2f}x - "
        + ("reproduced within 20%" if r["reproduced"] else "NOT reproduced within 20%")
    )
    return 0 if r["reproduced"] else 1
