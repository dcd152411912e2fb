"""``ptt doctor run --tune`` on Ultralytics YOLO's trainer: its data pipeline, stock and through
``ptt.ultralytics.accelerate``, measured on its own arguments, data, dataset and loader; the receipt's ``apply.py``
is its training call with that one line.

Why: Ultralytics' trainer is not a model-and-loss loop that tune's candidates (precision, accumulation, compile,
...) can be run on from outside; what can change there without touching its training is where its pixels come
from, and the integration is that change. Each candidate builds the trainer's training dataset the way its trainer
does (``build_yolo_dataset`` on its arguments: mosaic, affine, HSV as configured) and its own loader
(``InfiniteDataLoader``, the run's workers); tune times whole batches of each in interleaved rounds and compares
each with the stock loader's in the same round (``clock.compare``). ``match="speed"`` decodes fewer pixels and
strays further from the stock pixels: a candidate is recommended only when its pixels are within
``PSNR_FLOOR_DB`` of the stock load (median over ``PSNR_IMAGES`` of the run's images) and the lower quartile of its
per-round speed ratio is above 1 (faster beyond the rounds' own spread).

The step is projected from the loader's measured time per batch and the run's own step without its data wait (or
``--device-step-ms``, the accelerator's): with 0 workers the two add up, with workers the slower one sets the pace.

Caveats: ``cache='ram'`` is measured reading from the files (the cache's one-off build would be most of a short
run; its arena is the integration's, see its guide); a dataset the integration does not read (classify, a
multi-modal set) gets no candidate, said in the error.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytorchtricks.core import PttError

__all__ = ["CANDIDATES", "PSNR_FLOOR_DB", "YoloWorkload", "check_yolo", "tune_yolo", "yolo_workload"]

CANDIDATES: dict[str, str | None] = {"stock": None, "accelerate": "stock", "accelerate-speed": "speed"}
LINES = {  # the receipt's one line per candidate (what apply.py adds before model.train)
    "accelerate": "ptt.ultralytics.accelerate(model)",
    "accelerate-speed": 'ptt.ultralytics.accelerate(model, match="speed")',
}
CLI = {"accelerate": "ptt yolo", "accelerate-speed": "ptt yolo --match speed"}
PSNR_FLOOR_DB = (
    35.0  # the integration's equivalence bar against the stock load (its tests hold it on >= 8 MP)
)
PSNR_IMAGES = 8  # images compared, spread evenly over the dataset
BATCHES_PER_CALL = 2  # one timed call: this many batches from the candidate's loader


@dataclass(frozen=True)
class YoloWorkload:
    """What tune needs of an Ultralytics training run: its arguments (JSON values), the training images, batch,
    workers, the model's stride, and the run's step without its data wait."""

    args: dict[str, Any]
    img_path: Any
    batch: int
    workers: int
    stride: int
    images: int
    command: list[str] = field(default_factory=list)
    step_s: float = 0.0
    trainer: str = ""
    data: Any = field(default=None, repr=False, compare=False)  # the trainer's data dict (not in the receipt)


def yolo_workload(
    dataset: Any, model: Any, loader: dict[str, Any], command: list[str], step_s: float
) -> YoloWorkload:
    """The workload of a run whose loader reads Ultralytics' ``dataset`` and whose optimizer steps ``model`` (the
    doctor run's captured objects): the trainer's arguments are the ones it attaches to its model (``model.args``)."""
    inner = getattr(model, "module", model)  # DDP
    hyp = getattr(inner, "args", None)
    if hyp is None or isinstance(hyp, dict) or not hasattr(dataset, "img_path"):
        raise PttError(
            f"--tune on an Ultralytics trainer reads the arguments its trainer attaches to the model (model.args); "
            f"{type(inner).__name__} over {type(dataset).__name__} has none: the integration reads the detect, "
            "segment, pose and obb trainers' datasets."
        )
    args = {k: v for k, v in vars(hyp).items() if _plain(v)}
    from pytorchtricks.integrations.ultralytics import TASKS
    from pytorchtricks.integrations.ultralytics_data import is_detection_pack

    if is_detection_pack(dataset.img_path):
        raise PttError(
            f"this run reads the ptt pack {dataset.img_path} (through ptt.ultralytics already): Ultralytics' stock "
            "loader cannot read a pack, so there is nothing to compare it with. Run --tune on the run that reads "
            "the original YOLO root to measure the integration there."
        )
    if args.get("task", "detect") not in TASKS:
        raise PttError(
            f"--tune on Ultralytics' {args.get('task')} trainer: ptt.ultralytics reads the datasets of "
            f"{', '.join(TASKS)} (its YOLODataset); this one keeps its stock loader, so there is no candidate to measure."
        )
    return YoloWorkload(
        args=args,
        img_path=dataset.img_path,
        batch=int(loader.get("batch_size") or dataset.batch_size),
        workers=int(loader.get("num_workers") or 0),
        stride=int(dataset.stride),
        images=len(dataset),
        command=list(command),
        step_s=float(step_s),
        trainer=str(args.get("task") or "detect"),
        data=getattr(dataset, "data", None),
    )


def _plain(v: Any) -> bool:
    return (
        v is None
        or isinstance(v, bool | int | float | str)
        or (isinstance(v, list | tuple) and all(isinstance(x, bool | int | float | str) for x in v))
    )


def tune_yolo(
    w: YoloWorkload,
    *,
    out: str,
    time_budget_s: float | None = None,
    device_step_ms: float | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Measure every candidate on ``w``, write the receipt to ``out`` and return its payload."""
    p = measure(w, time_budget_s=time_budget_s, device_step_ms=device_step_ms, progress=progress)
    write_yolo_receipt(p, out)
    return p


def _datasets(w: YoloWorkload) -> dict[str, Any]:
    from pytorchtricks.integrations import ultralytics as ptt_yolo

    data = w.data if w.data is not None else _trainer_data(w.args)
    args = dict(w.args, cache=False)  # the files are read each time (see the module's caveats)
    return {
        name: ptt_yolo.train_dataset(args, w.img_path, w.batch, data, w.stride, match=m)
        for name, m in CANDIDATES.items()
    }


def _trainer_data(args: dict[str, Any]) -> dict[str, Any]:
    """The data dict Ultralytics' trainer makes of ``args["data"]`` (its YAML checked and resolved)."""
    from ultralytics.data.utils import check_det_dataset

    return dict(check_det_dataset(args["data"]))


def _pixels(datasets: dict[str, Any]) -> dict[str, list[float]]:
    """Each candidate's PSNR against the stock load, on ``PSNR_IMAGES`` images spread over the dataset."""
    from pytorchtricks.tune.datacheck import psnr_db

    stock = datasets["stock"]
    n = len(stock)
    picks = sorted({int(k) for k in np.linspace(0, n - 1, min(n, PSNR_IMAGES))})
    out: dict[str, list[float]] = {}
    for name, ds in datasets.items():
        if name == "stock":
            continue
        got = []
        for i in picks:
            a, b = stock.load_image(i)[0], ds.load_image(i)[0]
            if a.shape != b.shape:  # a pack stores a pixel more or less than Ultralytics' rounding
                import cv2

                b = cv2.resize(b, (a.shape[1], a.shape[0]), interpolation=cv2.INTER_LINEAR)
            got.append(psnr_db(a, b))
        out[name] = got
    return out


def measure(
    w: YoloWorkload,
    *,
    time_budget_s: float | None = None,
    device_step_ms: float | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """The receipt's payload: each candidate's images/s through the trainer's own dataset and loader, its ratio
    to stock (paired by round), its PSNR against the stock load, the projected step, and the recommendation."""
    from pytorchtricks.clock import compare, environment
    from pytorchtricks.integrations import ultralytics as ptt_yolo

    budget = 120.0 if time_budget_s is None else float(time_budget_s)
    if progress is not None:
        progress.phase("building the trainer's dataset, stock and through ptt", len(CANDIDATES))
    datasets = _datasets(w)
    if progress is not None:
        progress.advance(len(CANDIDATES))
        progress.phase("pixels against the stock load", None)
    psnr = _pixels(datasets)
    iters = {n: _forever(ptt_yolo.train_loader(ds, w.batch, w.workers)) for n, ds in datasets.items()}

    def call(it: Any) -> Any:
        return lambda: [next(it) for _ in range(BATCHES_PER_CALL)]

    def drain_prefetched(name: str) -> None:
        """What its workers made while the others were timed is not its speed: taken untimed."""
        for _ in range(2 * w.workers):
            next(iters[name])

    if progress is not None:
        progress.phase("interleaved rounds: stock vs accelerate", None)
    cmp = compare(
        {n: call(it) for n, it in iters.items()},
        baseline="stock",
        rounds=1000,
        min_rounds=3,
        budget_s=budget,
        warmup=1,
        min_run_time_s=0.0,
        single_call=tuple(iters),
        before_block=drain_prefetched if w.workers else None,
        on_round=(lambda r: progress.advance()) if progress is not None else None,
    )
    step_s, step_from = (
        (device_step_ms / 1e3, f"the declared {device_step_ms:g} ms accelerator step")
        if device_step_ms is not None
        else (w.step_s, f"the run's own step without its data wait ({w.step_s * 1e3:.0f} ms)")
    )
    rows = [_row(n, cmp.variants[n], psnr.get(n), w, step_s, cmp.rounds) for n in CANDIDATES]
    base = rows[0]["projected_step_s"]
    for r in rows:
        r["projected_gain"] = base / r["projected_step_s"] if r["projected_step_s"] else None
    best = _recommend(rows)
    for r in rows:
        r["recommended"] = r["candidate"] == best
    if progress is not None:
        progress.done()
    workload = {
        "args": w.args, "img_path": w.img_path, "batch": w.batch, "workers": w.workers, "stride": w.stride,
        "images": w.images, "command": w.command, "step_s": w.step_s, "trainer": w.trainer,
    }  # fmt: skip
    return {
        "kind": "ultralytics",
        "workload": workload,
        "candidates": rows,
        "recommended": best,
        "why": _why(rows, best),
        "step_from": step_from,
        "device_step_ms": device_step_ms,
        "rounds": cmp.rounds,
        "time_budget_s": budget,
        "env": environment("cpu"),
    }


def _forever(loader: Any) -> Any:
    """Batches of ``loader`` epoch after epoch (its iterator ends with each epoch; its workers stay)."""
    while True:
        yield from loader


def _row(
    name: str, v: Any, psnr: list[float] | None, w: YoloWorkload, step_s: float, rounds: int
) -> dict[str, Any]:
    per_batch = v.stats.median_s / BATCHES_PER_CALL
    return {
        "candidate": name,
        "line": LINES.get(name),
        "match": CANDIDATES[name],
        "images_per_s": w.batch / per_batch if per_batch else None,
        "batch_s_median": per_batch,
        "batch_s_q1": v.stats.q1_s / BATCHES_PER_CALL,
        "batch_s_q3": v.stats.q3_s / BATCHES_PER_CALL,
        "ratio": v.ratio,
        "ratio_q1": v.ratio_q1,
        "ratio_q3": v.ratio_q3,
        "rounds": rounds,
        "psnr_db_median": float(np.median(psnr)) if psnr else None,
        "psnr_db_min": float(min(psnr)) if psnr else None,
        "projected_step_s": (step_s + per_batch) if w.workers == 0 else max(step_s, per_batch),
    }


def _recommend(rows: list[dict[str, Any]]) -> str | None:
    """The fastest candidate whose pixels hold ``PSNR_FLOOR_DB`` and whose lower-quartile ratio beats stock;
    ``match="speed"`` only when its lower quartile beats the default's median (else the closer pixels)."""
    ok = [
        r for r in rows[1:] if (r["psnr_db_median"] or 0.0) >= PSNR_FLOOR_DB and (r["ratio_q1"] or 0.0) > 1.0
    ]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["ratio"])
    default = next((r for r in ok if r["candidate"] == "accelerate"), None)
    if default is not None and best["ratio_q1"] <= default["ratio"]:
        return "accelerate"  # not faster beyond the spread: the pixels closer to the stock load win
    return str(best["candidate"])


def _why(rows: list[dict[str, Any]], best: str | None) -> str:
    if best is not None:
        r = next(x for x in rows if x["candidate"] == best)
        return (
            f"{r['line']}: its data pipeline {r['ratio']:.2f}x stock (quartiles {r['ratio_q1']:.2f}-"
            f"{r['ratio_q3']:.2f}x over {r['rounds']} interleaved rounds), pixels {r['psnr_db_median']:.1f} dB PSNR "
            f"(median) against the stock load."
        )
    said = []
    for r in rows[1:]:
        if (r["psnr_db_median"] or 0.0) < PSNR_FLOOR_DB:
            said.append(f"{r['candidate']}: pixels {r['psnr_db_median']:.1f} dB, under {PSNR_FLOOR_DB:g} dB")
        else:
            said.append(
                f"{r['candidate']}: {r['ratio']:.2f}x, its lower quartile {r['ratio_q1']:.2f}x not above stock"
            )
    return "keep the stock loader: " + "; ".join(said) + "."


# ---------------------------------------------------------------------------------------------------------------
# the receipt


def write_yolo_receipt(p: dict[str, Any], out: str) -> str:
    """``out``/results.jsonl, apply.py, report.html, receipt.json (atomically, as every tune receipt)."""
    from pytorchtricks.report.html import render_yolo
    from pytorchtricks.tune.receipt import write_receipt_files

    rows = [{**r, "env": p["env"]} for r in p["candidates"]]
    texts = {
        "apply.py": apply_yolo(p),
        "report.html": render_yolo(p),
        "receipt.json": json.dumps(p, indent=1, sort_keys=True, default=str),
    }
    return write_receipt_files(out, rows, texts)


def _is_cli(command: list[str]) -> bool:
    return bool(command) and os.path.basename(command[0]) == "yolo"


def train_call(args: dict[str, Any], command: list[str]) -> tuple[str, dict[str, Any], bool]:
    """The model, the ``model.train(...)`` keywords and whether they are exactly the user's: the ``yolo`` CLI's
    ``key=value`` arguments as it parses them; else (a script) the trainer's arguments that differ from
    Ultralytics' defaults, which include a few it fills itself (``optimizer=auto`` sets ``lr0``)."""
    if _is_cli(command):
        from ultralytics.cfg import smart_value

        kw = dict(a.split("=", 1) for a in command[2:] if "=" in a)
        model = kw.pop("model", "yolov8n.yaml")
        return str(model), {k: smart_value(v) for k, v in kw.items()}, True
    from ultralytics.cfg import DEFAULT_CFG_DICT

    skip = {"model", "mode", "save_dir"}
    kw = {k: v for k, v in args.items() if k not in skip and DEFAULT_CFG_DICT.get(k, object()) != v}
    return str(args.get("model") or "yolov8n.yaml"), kw, False


def apply_yolo(p: dict[str, Any]) -> str:
    """``apply.py``: the training call, with the recommended line before it; ``--check`` re-measures."""
    wl, best = p["workload"], p["recommended"]
    model, kw, exact = train_call(wl["args"], wl["command"])
    rows = {r["candidate"]: r for r in p["candidates"]}
    cmd = " ".join(shlex.quote(x) for x in wl["command"]) or "(a script)"
    measured = "; ".join(
        f"{r['candidate']} {r['images_per_s']:.1f}"
        + (f" ({r['psnr_db_median']:.1f} dB)" if r["psnr_db_median"] is not None else "")
        for r in p["candidates"]
    )
    head = [
        f'"""ptt tune receipt: Ultralytics YOLO `{cmd}` ({wl["trainer"]}, {wl["images"]} training images, batch '
        f"{wl['batch']}, {wl['workers']} loader workers), {p['env'].get('cpu')} ({p['env'].get('cpu_class')}), "
        f"{p['env'].get('time_utc', '')[:10]}.",
        "",
        ("Recommended: " + p["why"]) if best else ("No change recommended - " + p["why"]),
    ]
    if best:
        r = rows[best]
        gain = r["projected_gain"]
        head.append(
            f"The step, projected with {p['step_from']}: {gain:.2f}x."
            if gain is not None
            else "The step was not projected."
        )
        head.append(
            f"The yolo CLI form: {CLI[best]} {' '.join(shlex.quote(x) for x in wl['command'][1:])}"
            if _is_cli(wl["command"])
            else "The yolo CLI form: `ptt yolo ...` with the yolo arguments."
        )
    head += [
        f"Measured (images/s through its dataset and loader, mosaic on; PSNR against the stock load): {measured}.",
        "`python apply.py --check` measures stock and the recommendation again on this machine.",
        '"""',
    ]
    body = [
        "import sys",
        "",
        "from ultralytics import YOLO",
        "",
        "import pytorchtricks as ptt",
        "",
        "",
        "def train() -> None:",
        f"    model = YOLO({model!r})",
        f"    {LINES[best]}" if best else "    # ptt tune: the stock loader stays (see above)",
        *(
            []
            if exact
            else [
                f"    # as the trainer ran {cmd}: your own model.train(...) call there is the one to keep, with the "
                "line above before it",
            ]
        ),
        f"    model.train({', '.join(f'{k}={v!r}' for k, v in sorted(kw.items()))})",
        "",
        "",
        'if __name__ == "__main__":',
        '    if "--check" in sys.argv[1:]:',
        "        import os",
        "",
        "        from pytorchtricks.tune.reproduce import main",
        "",
        '        sys.exit(main(os.path.join(os.path.dirname(os.path.abspath(__file__)), "receipt.json"), sys.argv[1:]))',
        "    train()",
        "",
    ]
    return "\n".join(head + body)


def check_yolo(p: dict[str, Any], *, budget_s: float = 60.0) -> dict[str, Any]:
    """``python apply.py --check`` of an Ultralytics receipt: the same candidates measured again on its workload,
    the recommendation's ratio beside the receipt's (``reproduce`` judges them)."""
    wl = p["workload"]
    w = YoloWorkload(
        args=wl["args"], img_path=wl["img_path"], batch=int(wl["batch"]), workers=int(wl["workers"]),
        stride=int(wl["stride"]), images=int(wl["images"]), command=list(wl["command"]),
        step_s=float(wl["step_s"]), trainer=str(wl["trainer"]),
    )  # fmt: skip
    again = measure(w, time_budget_s=budget_s, device_step_ms=p.get("device_step_ms"))
    name = p["recommended"] or "accelerate"
    want = next(r for r in p["candidates"] if r["candidate"] == name)
    got = next(r for r in again["candidates"] if r["candidate"] == name)
    return {
        "candidate": name,
        "receipt_ratio": want["ratio"],
        "ratio": got["ratio"],
        "ratio_q1": got["ratio_q1"],
        "ratio_q3": got["ratio_q3"],
        "stock_images_per_s": again["candidates"][0]["images_per_s"],
        "images_per_s": got["images_per_s"],
        "recommended_now": again["recommended"],
    }
