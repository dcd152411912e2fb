"""The receipt of a tune run: ``DIR/report.html``, ``DIR/results.jsonl`` and ``DIR/apply.py``, written atomically.

Everything is written into a fresh temporary folder next to ``DIR`` and renamed into place at the end, so ``DIR``
is either the previous complete receipt or the new complete one - never half-written.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import textwrap
from dataclasses import asdict
from typing import Any

from pytorchtricks.clock import write_jsonl
from pytorchtricks.tune.accuracy import headline
from pytorchtricks.tune.hooks import by_name, with_requirements
from pytorchtricks.tune.measuring import TuneResult, where_measured


def shape_text(workload: dict[str, Any]) -> str:
    """One sample's shape from a receipt's workload: ``1x28x28`` (older receipts: ``64 px``)."""
    shape = workload.get("input_shape")
    return "x".join(map(str, shape)) if shape else f"{workload['input_size']} px"


def _clean(x: Any) -> Any:
    """JSON-safe copy: tuples to lists, non-finite floats to strings ("inf")."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def payload(res: TuneResult) -> dict[str, Any]:
    """The receipt as plain data (what report.html renders)."""
    out = _clean(asdict(res))
    out["measured_in"] = where_measured(res.phases_done)
    if res.accuracy is not None:  # the parity check's rule and answer in words, beside its figures
        out["accuracy"] |= {"rule": res.accuracy.rule, "headline": headline(res.accuracy)}
    return out  # type: ignore[no-any-return]


def rows(p: dict[str, Any]) -> list[dict[str, Any]]:
    """``results.jsonl`` rows: run (with the environment), diagnosis, one per candidate, combination, verify, summary."""
    out: list[dict[str, Any]] = [
        {
            "kind": "tune-run",
            "env": p["env"],
            "workload": p["workload"],
            "goal": p["goal"],
            "budget_s": p["budget_s"],
            "elapsed_s": p["elapsed_s"],
            "interrupted": p["interrupted"],
            "phases_done": p["phases_done"],
            "notes": p["notes"],
            "interleaved": True,
            # where the seconds went, who used the CPU in each phase (busy: the share others took), whether the
            # figures can be trusted, and the compute step timed in a fresh process beside tune's own figure
            "phase_s": p.get("phase_s"),
            "cpu": p.get("cpu"),
            "unreliable": p.get("unreliable"),
            "self_check": p.get("self_check"),
        },
    ]
    if p.get("diagnosis"):
        out.append({"kind": "tune-diagnosis", **p["diagnosis"]})
    if p.get("baseline"):
        out.append({"kind": "tune-baseline", **p["baseline"]})
    if p.get("step_baseline") and p["step_baseline"] != p.get("baseline"):
        out.append({"kind": "tune-baseline", **p["step_baseline"]})
    out += [{"kind": "tune-candidate", **c} for c in p["candidates"]]
    out += [{"kind": "tune-combination-step", **s} for s in p["combination"]]
    out += [{"kind": "tune-verify", **m} for m in p["final"]]
    if p.get("accuracy"):  # the parity check of --accuracy-steps: the answer, the rule, every loss
        out.append({"kind": "tune-accuracy", **p["accuracy"]})
    mem = p.get("memory")
    if mem:  # the memory search: every configuration (the frontier's points), then what it concluded
        out += [
            {"kind": "tune-memory-point", "label": " + ".join(pt["tricks"]) or "baseline", **pt}
            for pt in mem["points"]
        ]
        out.append({"kind": "tune-memory", **{k: v for k, v in mem.items() if k != "points"}})
    out.append(
        {
            "kind": "tune-summary",
            "recommended": p["recommended"],
            "combined": p["combined"],
            "combined_check": p["combined_check"],
            "after_split_s": p["after_split_s"],
            "env": p["env"],
        }
    )
    return out


def _nothing(p: dict[str, Any]) -> str:
    if p.get("unreliable"):
        return (
            "nothing - the measurements were unreliable (a busy machine?): see report.html, rerun when quiet"
        )
    return "nothing (keep the current setup)"


def _learns(p: dict[str, Any]) -> list[str]:
    """apply.py's docstring lines of the parity check (--accuracy-steps): its answer, a warning when outside."""
    acc = p.get("accuracy")
    if not acc:
        return []
    text = str(acc["headline"]).replace("\\", "/").replace('"', "'")  # inside the docstring
    if acc["answer"] == "outside":
        text = f"WARNING - {text}"
    return ["", *textwrap.wrap(text, 116), ""]


def _fields(p: dict[str, Any]) -> dict[str, Any]:
    """What a hook's receipt line may name: ``{batch_size}``, ``{input_size}``, ``{workers}``, ..."""
    wl = p["workload"]
    name, kwargs = (wl.get("optimizer") or ["sgd", {"lr": 0.01, "momentum": 0.9}])[:2]
    args = ", ".join([repr(name), *(f"{k}={v!r}" for k, v in kwargs.items())])
    size = int(wl["input_size"])
    return {
        "batch_size": wl["batch_size"],
        "input_size": size,
        "workers": int(wl.get("num_workers") or 0),
        "cache_side": max(size, round(size / 0.08**0.5)),
        "optimizer_args": args,
        "activation_budget": (p.get("memory") or {}).get("activation_budget_bytes"),
        "max_size": wl.get("max_size"),
        "task": wl.get("task", "classification"),
        "split_kw": f", split={wl['split']!r}" if wl.get("split") else "",  # the split of a detection root
    }


def _line(name: str, fields: dict[str, Any]) -> str:
    try:
        hook = by_name(name).hook
        if fields.get("task") == "detection" and hook.detection_receipt:
            return hook.detection_receipt.format(**fields)
        return hook.receipt.format(**fields)
    except KeyError:  # a trick this build no longer has (an old receipt)
        return "(not in this build)"


def _loop(hook: Any, fields: dict[str, Any]) -> str:
    """A step hook's own training loop for this task (a detector's loss dict, lists of images), or ""."""
    return str(hook.detection_loop if fields.get("task") == "detection" else hook.loop)


def _detection_inputs(ours: bool) -> list[str]:
    """The lines of a detection loop that make the detector's inputs (images, targets) of ``batch``: from our
    padded uint8 batches, or from the reference's list collate."""
    if ours:
        return [
            "images = [batch.images[i, :, :h, :w].to(device, non_blocking=True).float().div_(255)",
            "          for i, (h, w) in enumerate(batch.sizes.tolist())]",
            "targets = [{k: t[k].to(device) for k in ('boxes', 'labels')} for t in batch.targets]",
        ]
    return [
        "images = [im.to(device, non_blocking=True) for im in batch[0]]",
        "targets = [{k: t[k].to(device) for k in ('boxes', 'labels')} for t in batch[1]]",
    ]


def apply_snippet(p: dict[str, Any]) -> str:
    """``apply.py``: the user's setup plus, in the hooks' order, each recommended trick's own receipt line.

    ``apply(model, dataset, batch_size, device)`` returns ``(model, optimizer, loader, mp)`` (inference: no
    optimizer). The lines come from the tricks (``TUNE.receipt``); nothing here names a trick. The file reads top
    to bottom as: its docstring (``_header``), the imports, the lines for the user's own script
    (``_script_block``), ``apply()`` (``_apply_def``), the loop to run it in (``_loop_comment``), what was not
    applied, and the ``--check`` entry point (``_CHECK_MAIN``).
    """
    rec = list(p.get("recommended") or [])
    fields = _fields(p)
    names = (
        [n for n in with_requirements(tuple(rec)) if _line(n, fields) != "(not in this build)"] if rec else []
    )
    by_change: dict[str, list[str]] = {}  # the recommended tricks' lines by what their hook changes
    for n in names:
        by_change.setdefault(by_name(n).hook.changes, []).append(f"    # {n}\n    {_line(n, fields)}")
    script = _script_block(p, names, fields)
    skipped = [
        f"#   {c['name']}: {c['status']} - {c['reason']}" for c in p["candidates"] if c["status"] != "kept"
    ]
    lines = [
        *_header(p, rec),
        "",
        "import torch",
        "from torch.utils.data import DataLoader",
        "",
        "import pytorchtricks as ptt",
        "",
        *([*script, "", ""] if script else [""]),
        *_apply_def(p, fields, by_change),
        "",
        "",
        *_loop_comment(p, names, fields, by_change),
    ]
    if skipped:
        lines += ["#", "# Not applied:", *skipped]
    lines += _CHECK_MAIN
    return "\n".join(lines) + "\n"


def _header(p: dict[str, Any], rec: list[str]) -> list[str]:
    """apply.py's docstring: the workload, what is recommended, the parity check's answer, what was measured."""
    comb = p.get("combined")
    env = p["env"]
    measured = (
        f"{comb['ratio']:.2f}x images/s (IQR {comb['ratio_q1']:.2f}-{comb['ratio_q3']:.2f}) vs the baseline"
        if comb
        else "no trick beat the baseline"
    )
    return [
        f'"""Generated by `ptt tune` for {p["workload"]["model"]} ({p["workload"]["for"]}, batch '
        f"{p['workload']['batch_size']}, input {shape_text(p['workload'])}).",
        "",
        f"Recommended: {', '.join(rec) or _nothing(p)}.",
        *_learns(p),
        f"Measured on {env.get('device_name')} ({env.get('threads')} threads, torch {env.get('torch')}): {measured},",
        "from interleaved rounds. Evidence: report.html and results.jsonl next to this file.",
        '"""',
    ]


def _script_block(p: dict[str, Any], names: list[str], fields: dict[str, Any]) -> list[str]:
    """The lines for the user's own script (``_script_lines``), after the detection root a pack line reads."""
    script = _script_lines(p, names, fields)
    if fields["task"] == "detection" and any("ROOT" in _line(n, fields) for n in names):
        # a pack of the detection root tune read
        script = [f"ROOT = {p['workload'].get('source')!r}  # the detection root tune read: yours", *script]
    return script


def _apply_def(p: dict[str, Any], fields: dict[str, Any], by_change: dict[str, list[str]]) -> list[str]:
    """``def apply(...)``: the user's setup as today (model, optimizer, DataLoader, fp32), each followed by the
    recommended tricks' lines that change it, in the hooks' order."""
    train = p["workload"]["for"] == "train"
    detection = fields["task"] == "detection"
    workers = fields["workers"]
    extra = f", num_workers={workers}" if workers else ""
    body = ["    model.to(device)" if train else "    model.eval().to(device)", *by_change.get("model", [])]
    if train:
        body.append(f"    optimizer = torch.optim.{_torch_optim(fields)}  # the loop's own optimizer")
        body += by_change.get("optimizer", [])
    body.append(
        f"    loader = DataLoader(dataset, batch_size, shuffle={train}{extra}, collate_fn=lambda b: tuple(zip(*b)))"
        "  # as today (the detection reference's list collate)"
        if detection
        else f"    loader = DataLoader(dataset, batch_size, shuffle={train}, drop_last={train}{extra})  # as today"
    )
    body += by_change.get("loader", [])
    body.append("    mp = ptt.mixed_precision(device, enabled=False)  # fp32" + _fp32_reason(p["candidates"]))
    body += by_change.get("precision", []) + by_change.get("switch", [])
    ret = "model, optimizer, loader, mp" if train else "model, loader, mp"
    return [
        'def apply(model, dataset, batch_size, device="cpu"):',
        f'    """Apply the winning tricks; returns ({ret}). ``dataset``: '
        + (
            'ptt.open_detection(root) (a COCO / YOLO / VOC root)."""'
            if detection
            else 'ptt.JpegFolder(root) for image folders."""'
        ),
        *body,
        f"    return {ret}",
    ]


def _loop_comment(
    p: dict[str, Any], names: list[str], fields: dict[str, Any], by_change: dict[str, list[str]]
) -> list[str]:
    """The loop to run ``apply()``'s results in, as comments: a recommended step hook's own loop (K micro-batches
    per optimizer step) when there is one, else the plain step of this task (a detector's lists and loss dict)."""
    train = p["workload"]["for"] == "train"
    detection = fields["task"] == "detection"
    ours = "make_loader" in names
    loops = [  # a step hook's own loop replaces the plain one
        loop.format(
            receipt=_line(n, fields), detection_inputs="\n    ".join(_detection_inputs(ours)), **fields
        )
        for n in names
        if by_change.get("step") and by_name(n).hook.changes == "step"
        for loop in [_loop(by_name(n).hook, fields)]
        if loop
    ]
    if loops:
        return [
            "# Your loop, with the recommended step:",
            "\n".join(f"#     {ln}" for ln in loops[0].split("\n")),
        ]
    if detection and train:  # a detector takes a list of images and a list of targets, returns its losses
        return [
            "# In your loop (padded uint8 batches from ptt.make_detection_loader: each image cut to its size, /255"
            " on the device):"
            if ours
            else "# In your loop (batch: the reference's (images, targets) lists):",
            *(f"#     {ln}" for ln in _detection_inputs(ours)),
            "#     with mp.autocast():\n#         loss = sum(model(images, targets).values())  # the loss dict\n"
            "#     optimizer.zero_grad(set_to_none=True)\n#     mp.backward(loss)\n#     mp.step(optimizer)",
        ]
    return [
        "# In your loop (uint8 batches from ptt.make_loader: normalise on the device):",
        "#     x = x.to(device, non_blocking=True)",
        "#     with mp.autocast():\n#         loss = loss_fn(model(x), y)\n"
        "#     optimizer.zero_grad(set_to_none=True)\n#     mp.backward(loss)\n#     mp.step(optimizer)"
        if train
        else "#     with torch.inference_mode(), mp.autocast():\n#         out = model(x)",
    ]


_CHECK_MAIN = (  # apply.py's tail: `python apply.py --check` re-measures the receipt on this workload
    "",
    "",
    'if __name__ == "__main__":  # python apply.py --check: re-measure baseline vs recommended on this workload',
    "    import os",
    "    import sys",
    "",
    "    from pytorchtricks.tune.reproduce import main",
    "",
    '    sys.exit(main(os.path.join(os.path.dirname(os.path.abspath(__file__)), "receipt.json"), sys.argv[1:]))',
)


_SITE_OF = {  # which line of the user's script a trick's kind of change goes to (``TuneHook.changes``)
    "loader": ("loader", "replace"),
    "optimizer": ("optimizer", "replace"),
    "model": ("model", "after"),
    "switch": ("model", "before"),
    "precision": ("backward", "around"),
    "step": ("backward", "around"),
}


def _script_lines(p: dict[str, Any], names: list[str], fields: dict[str, Any]) -> list[str]:
    """For a receipt of ``ptt doctor run --tune``: the recommended tricks' lines grouped by the line of the user's
    script they change (file:line, that line's code, in the hooks' order), the script's own names kept, with what
    its own data settings become."""
    sc = p["workload"].get("script") or {}
    if not sc.get("file") or not names:
        return []
    sites = sc.get("sites") or {}
    base = os.path.basename(sc["file"])
    groups: dict[tuple[str, str], list[str]] = {}
    for n in names:
        kind, how = _SITE_OF.get(_changes(n), ("", ""))
        groups.setdefault((kind, how), []).append(n)
    out = [f"# In your script, {sc['file']}: what to change, and where."]
    for (kind, how), group in groups.items():
        site = sites.get(kind) or (sites.get("call") if kind == "model" else None)
        out.append(
            f"#   {base}:{site['line']}  {site['code']}" if site else f"#   {base} (this line was not seen)"
        )
        var = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=[^=]", site["code"]) if site else None
        verb = {
            "replace": "replace it with",
            "after": "after it",
            "before": "before it",
            "around": "around it",
        }
        out.append(f"#     {verb.get(how, 'add')} ({', '.join(group)}):")
        code = [_line(n, fields) for n in group]
        if kind == "loader" and fields.get("task") == "detection":
            code.insert(
                0,
                f"dataset = ptt.open_detection({sc.get('annotations') or 'YOUR/instances_TRAIN.json'!r}, "
                f"images={sc.get('root')!r})  # the annotation file and images your CocoDetection reads",
            )
            code = [re.sub(r"^loader = ", f"{var.group(1)} = ", c) if var else c for c in code]
            out += [f"#         {c}" for c in code]
            out += [
                "#     drop the batch sampler and the collate: make_detection_loader groups by aspect ratio itself",
                "#     in the loop: images = [b.images[i, :, :h, :w].to(device).float().div_(255) for i, (h, w) in "
                "enumerate(b.sizes.tolist())]; targets = b.targets",
            ]
            out += _detection_parts(sites)
            continue
        if kind == "loader":
            if sc.get("root"):
                code.insert(
                    0, f"dataset = ptt.JpegFolder({sc['root']!r})  # your ImageFolder's folder, as JPEG bytes"
                )
            code = [re.sub(r"^loader = ", f"{var.group(1)} = ", c) if var else c for c in code]
        out += [f"#         {c}" for c in code]
        if kind == "loader":
            out += [f"#     {x}" for x in _loader_notes(sc)]
    return out


def _detection_parts(sites: dict[str, Any]) -> list[str]:
    """The script's lines that made the detection loader's dataset and batch sampler, and what becomes of them
    once ``make_detection_loader`` reads the annotations itself."""
    out = []
    for kind, what in (
        (
            "dataset",
            "its CocoDetection (and the transforms policy) is what ptt.open_detection replaces above: the same "
            "annotation file and images; keep the line where the script needs it for more (num_classes, the "
            "evaluation set)",
        ),
        (
            "sampler",
            "drop it (and the aspect-ratio groups computed for it): make_detection_loader groups by aspect ratio "
            "itself, every image once per epoch (DistributedSampler's ranks too)",
        ),
    ):
        site = sites.get(kind)
        if site:
            out += [f"#   {os.path.basename(site['file'])}:{site['line']}  {site['code']}", f"#     {what}"]
    return out


def _loader_notes(sc: dict[str, Any]) -> list[str]:
    """What a loader trick keeps of the script's own data settings, and what its uint8 batches need."""
    notes = []
    t = sc.get("transform") or {}
    keep = [f"{k}={tuple(t[k])!r}" for k in ("scale", "ratio") if k in t and _not_default(k, t[k])]
    if keep:
        notes.append(
            f"pass {', '.join(keep)} to ptt.make_loader (your RandomResizedCrop's; the default is (0.08, 1))"
        )
    norm = ".float().div_(255)"
    if "mean" in t and "std" in t:
        mean = ", ".join(f"{255 * v:.3f}" for v in t["mean"])
        std = ", ".join(f"{255 * v:.3f}" for v in t["std"])
        norm = (
            f".float().sub_(torch.tensor([{mean}], device=device).view(1, 3, 1, 1))"
            f".div_(torch.tensor([{std}], device=device).view(1, 3, 1, 1))  # your Normalize"
        )
    notes.append(
        f"batches are uint8 [N,3,H,W]: in the loop, images = images.to(device, non_blocking=True){norm}"
    )
    return notes


def _not_default(key: str, value: list[float]) -> bool:
    default = {"scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3)}[key]
    return any(abs(a - b) > 1e-3 for a, b in zip(value, default, strict=True))


def _torch_optim(fields: dict[str, Any]) -> str:
    name, _, rest = fields["optimizer_args"].partition(", ")
    cls = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop"}.get(name.strip("'\""), "SGD")
    return f"{cls}(model.parameters(){', ' + rest if rest else ''})"


def _changes(name: str) -> str:
    try:
        return by_name(name).hook.changes
    except KeyError:
        return ""


def _fp32_reason(candidates: list[dict[str, Any]]) -> str:
    """Why fp32 stays, from the precision candidate's row (no bf16 advice where bf16 was not measured)."""
    row = next((c for c in candidates if _changes(c["name"]) == "precision"), None)
    if row is None:
        return ""
    if row["status"] in ("rejected", "failed"):
        return ": bf16 was measured, fp32 won"
    return f": {row['reason']}" if row["status"] == "skipped" else ""


RECEIPT_FILES = ("results.jsonl", "apply.py", "report.html", "receipt.json")


def write_receipt(res: TuneResult, out_dir: str) -> str:
    """Write the receipt of ``res`` to ``out_dir`` atomically (``write_receipt_files``); returns the folder."""
    from pytorchtricks.report.html import render

    p = payload(res)
    return write_receipt_files(
        out_dir,
        rows(p),
        {
            "apply.py": apply_snippet(p),
            "report.html": render(p),
            "receipt.json": json.dumps(p, indent=1, sort_keys=True),
        },
    )


def write_receipt_files(out_dir: str, results: list[dict[str, Any]], texts: dict[str, str]) -> str:
    """Write a receipt's four files to ``out_dir`` atomically: ``results.jsonl`` (``results``, a row per line) and
    the other ``RECEIPT_FILES`` (``texts`` by name).

    A new folder, or one that holds only an earlier receipt, is swapped whole (the four files change together). A
    folder that holds anything else (``--out .``, a project folder, a log beside the receipt) keeps it: each file
    of the receipt is renamed into place, ``receipt.json`` last, and nothing else there is touched."""
    if {"results.jsonl", *texts} != set(RECEIPT_FILES):
        raise ValueError(
            f"a receipt is {', '.join(RECEIPT_FILES)}; got results.jsonl, {', '.join(sorted(texts))}"
        )
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    old = None
    try:
        write_jsonl(os.path.join(tmp, "results.jsonl"), results)
        for name, text in texts.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        os.chmod(tmp, 0o755)
        if os.path.isdir(out_dir) and set(os.listdir(out_dir)) - set(RECEIPT_FILES):
            for name in RECEIPT_FILES:  # receipt.json last: apply.py --check reads it
                os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
            os.rmdir(tmp)
            return out_dir
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
            os.replace(out_dir, os.path.join(old, "prev"))
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.exists(out_dir):
            os.replace(os.path.join(old, "prev"), out_dir)  # put the previous receipt back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out_dir
