"""The receipt of a tune run: ``DIR/report.html``, ``DIR/results.jsonl`` and ``DIR/apply.py``, written atomically.

Everything is written into a fresh temporary folder next to ``DIR`` and renamed into place at the end, so ``DIR``
is either the previous complete receipt or the new complete one - never half-written.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict
from typing import Any

from pytorchtricks.bench.measure import write_jsonl
from pytorchtricks.tune.candidates import by_name
from pytorchtricks.tune.engine import TuneResult
from pytorchtricks.tune.runner import loader_workers


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
    return _clean(asdict(res))  # type: ignore[no-any-return]


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


def _precision_line(rec: list[str], candidates: list[dict[str, Any]]) -> str:
    """The ``mp = ...`` line: bf16 only where it won; where it was not tried (no native bf16), no bf16 advice."""
    if "mixed_precision" in rec:
        return '    mp = ptt.mixed_precision(device, dtype="bf16")'
    row = next((c for c in candidates if c["name"] == "mixed_precision"), None)
    if row is not None and row["status"] in ("rejected", "failed"):
        return (
            '    mp = ptt.mixed_precision(device, dtype="bf16", enabled=False)  # bf16 was measured: fp32 won'
        )
    return "    mp = ptt.mixed_precision(device, enabled=False)  # fp32" + (
        f": {row['reason']}" if row is not None and "bf16" in row["reason"] else ""
    )


def apply_snippet(p: dict[str, Any]) -> str:
    """``apply.py``: a short, runnable function that applies the recommended tricks to the user's objects."""
    rec = list(p.get("recommended") or [])
    train = p["workload"]["for"] == "train"
    comb = p.get("combined")
    env = p["env"]
    measured = (
        f"{comb['ratio']:.2f}x images/s (IQR {comb['ratio_q1']:.2f}-{comb['ratio_q3']:.2f}) vs the baseline"
        if comb
        else "no trick beat the baseline"
    )
    body: list[str] = []
    if "remove_conv_bias_before_bn" in rec:
        body.append(
            "    ptt.remove_conv_bias_before_bn_(model)  # exact: the bias moves into BN's running_mean"
        )
    if not train:
        body.append("    model.eval()")
    if "fuse_conv_bn" in rec:
        body.append("    ptt.fuse_conv_bn_(model)  # exact: BN folded into the conv weights")
    body.append("    model.to(device)")
    if "to_channels_last" in rec:
        body.append(
            "    ptt.to_channels_last_(model)  # feed inputs with x.contiguous(memory_format=torch.channels_last)"
        )
    if train:
        if "fast_optimizer" in rec:
            body.append('    optimizer = ptt.fast_optimizer(model.parameters(), "sgd", lr=lr, momentum=0.9)')
        else:
            body.append("    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)")
    if "compile" in rec:
        body.append(f"    ptt.compile_(model, for_inference={not train})")
    if "loader_workers" in rec:
        body.append(
            "    loader = DataLoader(dataset, batch_size, shuffle=True, drop_last=True, "
            f"num_workers={loader_workers()},\n                        persistent_workers=True, prefetch_factor=2)"
        )
    else:
        workers = int(p["workload"].get("num_workers") or 0)  # the user's own setting, kept as it was
        extra = f", num_workers={workers}, persistent_workers=True" if workers else ""
        body.append(f"    loader = DataLoader(dataset, batch_size, shuffle=True, drop_last=True{extra})")
    body.append(_precision_line(rec, p["candidates"]))
    ret = "model, optimizer, loader, mp" if train else "model, loader, mp"
    skipped = [
        f"#   {c['name']}: {c['status']} - {c['reason']}" for c in p["candidates"] if c["status"] != "kept"
    ]
    step = (
        "#     with mp.autocast():\n#         loss = loss_fn(model(x), y)\n"
        "#     optimizer.zero_grad(set_to_none=True)\n#     mp.backward(loss)\n#     mp.step(optimizer)"
        if train
        else "#     with torch.inference_mode(), mp.autocast():\n#         out = model(x)"
    )
    lines = [
        f'"""Generated by `ptt tune` for {p["workload"]["model"]} ({p["workload"]["for"]}, batch '
        f"{p['workload']['batch_size']}, input {shape_text(p['workload'])}).",
        "",
        f"Recommended: {', '.join(rec) or 'nothing (keep the current setup)'}.",
        f"Measured on {env.get('device_name')} ({env.get('threads')} threads, torch {env.get('torch')}): {measured},",
        "from interleaved rounds. Evidence: report.html and results.jsonl next to this file.",
        '"""',
        "",
        "import torch",
        "from torch.utils.data import DataLoader",
        "",
        "import pytorchtricks as ptt",
        "",
        "",
        'def apply(model, dataset, batch_size, device="cpu", lr=0.01):',
        f'    """Apply the winning tricks; returns ({ret})."""',
        *body,
        f"    return {ret}",
        "",
        "",
        "# In your loop:",
        "#     x = x.to(device, non_blocking=True)"
        + (".contiguous(memory_format=torch.channels_last)" if "to_channels_last" in rec else ""),
        step,
    ]
    if skipped:
        lines += ["#", "# Not applied:", *skipped]
    for name in rec:
        lines.append(f"# {name}: {by_name(name).apply.format(workers=loader_workers())}")
    return "\n".join(lines) + "\n"


def write_receipt(res: TuneResult, out_dir: str) -> str:
    """Write the receipt of ``res`` to ``out_dir`` atomically; returns the folder."""
    from pytorchtricks.report.html import render

    p = payload(res)
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    old = None
    try:
        write_jsonl(os.path.join(tmp, "results.jsonl"), rows(p))
        with open(os.path.join(tmp, "apply.py"), "w", encoding="utf-8") as fh:
            fh.write(apply_snippet(p))
        with open(os.path.join(tmp, "report.html"), "w", encoding="utf-8") as fh:
            fh.write(render(p))
        with open(os.path.join(tmp, "receipt.json"), "w", encoding="utf-8") as fh:
            json.dump(p, fh, indent=1, sort_keys=True)
        os.chmod(tmp, 0o755)
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
