"""The receipt's self-check: the compute step timed alone in a fresh process, beside tune's own figure.

tune times its "compute alone" step inside a long-lived process that has built packs, caches and loaders and run
many variants; a figure that drifted there (a busy machine, a leftover worker, a cold or fragmented allocator) would
skew every decision taken from it. A fresh ``python -m pytorchtricks.tune.selfcheck`` builds the same model at the
same batch and input shape (synthetic batches: the step's arithmetic does not depend on the pixel values), with
the same thread count and optimizer, and times the same staged step; the receipt shows both and their ratio.

    $ python -m pytorchtricks.tune.selfcheck '{"model": "torchvision:resnet18", "batch_size": 32, ...}'
    {"median_s": 0.41, "steps": 5, ...}
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytorchtricks.tune.workload import Workload

# tune's figure and the fresh process's may differ by this factor before the receipt calls them inconsistent: the
# run-to-run drift of one step on a shared VM (CONTRIBUTING: ratios compare within a run only) is well inside it,
# a busy neighbour or a leftover worker (5-8x, issue 29) is far outside it
AGREE_WITHIN = 1.5
WINDOW_S = 0.5  # the same window and statistic as the diagnosis's compute-alone figure (its fastest step)


def request(workload: dict[str, Any], threads: int, data: str | None = None) -> dict[str, Any] | None:
    """What the fresh process needs to rebuild the step, from the receipt's workload (None: it cannot be
    rebuilt - a captured model object lives only in the user's process)."""
    model = workload.get("model")
    if not isinstance(model, str) or model.startswith("captured "):
        return None
    return {
        "model": model,
        "batch_size": workload["batch_size"],
        "input_shape": workload["input_shape"],
        "for": workload["for"],
        "device": workload["device"],
        "optimizer": workload.get("optimizer"),
        "threads": threads,
        "task": workload.get("task", "classification"),
        # the built-in ResNet-18's head is sized to the data's classes
        "num_outputs": workload.get("num_outputs"),
        # a detector's step needs its images and boxes (the same data, read again); a classifier's arithmetic does
        # not depend on the pixels, so synthetic batches of the same shape serve
        "data": data if workload.get("task") == "detection" else "synthetic",
        "split": workload.get("split") if workload.get("task") == "detection" else None,
    }


def run_fresh(req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run the self-check in a new interpreter; returns its JSON, or ``{"error": ...}``."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytorchtricks.tune.selfcheck", json.dumps(req)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the fresh process took more than {timeout_s:.0f} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    except (ValueError, IndexError):
        return {"error": f"unreadable output: {out.stdout[-200:]!r}"}


def compare_figures(tune_s: float | None, fresh: dict[str, Any]) -> dict[str, Any]:
    """The self-check's verdict: the two figures and whether they agree within ``AGREE_WITHIN``."""
    out = dict(fresh)
    out["tune_compute_alone_s"] = tune_s
    # tune's figure is the fastest staged step: compared with the fastest here
    if tune_s and fresh.get("min_s"):
        ratio = tune_s / fresh["min_s"]
        out["ratio"] = round(ratio, 3)
        out["agrees"] = 1 / AGREE_WITHIN <= ratio <= AGREE_WITHIN
    return out


def _main(argv: list[str]) -> int:
    import torch

    from pytorchtricks.clock import CpuMeter, time_call
    from pytorchtricks.tune.runner import Runner, stage_batches
    from pytorchtricks.tune.workload import build_workload

    req = json.loads(argv[0])
    torch.set_num_threads(int(req["threads"]))
    opt = req.get("optimizer")
    detect = req.get("task") == "detection"
    w = build_workload(
        req["model"], req.get("data", "synthetic"), batch_size=int(req["batch_size"]),
        input_shape=None if detect else tuple(req["input_shape"]),
        input_size=int(req["input_shape"][1]) if detect else None, num_workers=0, for_=req["for"],
        device=req["device"], optimizer=(opt[0], opt[1]) if opt else None, task=req.get("task", "classification"),
        split=req.get("split"),
    )  # fmt: skip
    want = req.get("num_outputs")
    # a head tune resized to its data's classes: the same here
    if not detect and want and w.num_outputs != want:
        w = _with_head(w, int(want))
    r = Runner(w, (), batches=stage_batches(w, 2))
    try:
        r.step()  # the first steps pay lazy initialisation (allocator, kernel and primitive caches)
        r.step()
        times: list[float] = []
        # as tune's diagnosis times it: at least WINDOW_S of steps, the fastest reported
        with CpuMeter() as cm:
            while len(times) < int(req.get("steps", 5)) or (sum(times) < WINDOW_S and len(times) < 200):
                times.append(time_call(r.step, w.device)[1])
        times.sort()
    finally:
        r.close()
    assert cm.result is not None
    print(
        json.dumps(
            {
                "median_s": times[len(times) // 2],
                "min_s": times[0],
                "steps": len(times),
                "threads": torch.get_num_threads(),
                "others_cores": round(cm.result.others_cores, 3),
            }
        )
    )
    return 0


def _with_head(w: Workload, n: int) -> Workload:
    """The workload with the head tune's had: its model's last Linear with ``w.num_outputs`` outputs made ``n``
    wide (a new workload; ``w`` as it was when the model has no such Linear)."""
    import copy
    import dataclasses

    from torch import nn

    model = w.model_factory()
    heads = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and m.out_features == w.num_outputs
    ]
    if not heads:
        return w
    name, old = heads[-1]
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    setattr(parent, name.rpartition(".")[2], nn.Linear(old.in_features, n, bias=old.bias is not None))
    state = copy.deepcopy(model)
    return dataclasses.replace(w, model_factory=lambda: copy.deepcopy(state), num_outputs=n)


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
