"""``ptt doctor run -- python train.py ARGS``: the user's unmodified script, run in this process and timed per step.

The script runs as ``python`` would run it (``__main__``, ``sys.argv``, the script's folder first on ``sys.path``,
the current directory unchanged), under the recorder of ``step_split`` (PyTorch's public hooks plus a few
well-scoped patches, all removed when the run ends), which also notes where the script builds its loader, optimizer
and model. The process-wide torch switches the script sets (cudnn, TF32, determinism, threads, grad mode, default
dtype), the RNG state, ``sys.argv``/``sys.path`` and the current directory are given back afterwards. After
``warmup`` + ``steps`` optimizer steps the run stops cleanly (an exception the script's ``except Exception`` cannot
swallow); a script that ends sooner is reported as it is. The instrumentation adds time, never changes what the
script computes (tested: the same losses with and without it).
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.analysis.loader_shm import SHM_FIX, is_shm_failure
from pytorchtricks.analysis.step_split import (
    STAGES,
    Recorder,
    RunReport,
    StopRun,
    collect,
    instrument,
    lint_model,
)
from pytorchtricks.core import PttError

__all__ = [
    "STAGES", "RunReport", "compare_runs", "read_summary", "run_script", "tune_arguments", "ultralytics_dataset",
    "write_run",
]  # fmt: skip


def _torch_state() -> dict[str, Any]:
    """The process-wide switches a training script commonly sets (cudnn, TF32, determinism, threads, grad
    mode, default dtype): ``run_script`` gives them back, so the caller's process is as it was."""
    b = torch.backends
    return {
        "cudnn.benchmark": b.cudnn.benchmark, "cudnn.deterministic": b.cudnn.deterministic,
        "cudnn.enabled": b.cudnn.enabled, "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "matmul.allow_tf32": b.cuda.matmul.allow_tf32, "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic.warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "threads": torch.get_num_threads(), "grad": torch.is_grad_enabled(), "dtype": torch.get_default_dtype(),
    }  # fmt: skip


def _restore_torch_state(st: dict[str, Any]) -> None:
    b = torch.backends
    b.cudnn.benchmark, b.cudnn.deterministic = st["cudnn.benchmark"], st["cudnn.deterministic"]
    b.cudnn.enabled, b.cudnn.allow_tf32 = st["cudnn.enabled"], st["cudnn.allow_tf32"]
    b.cuda.matmul.allow_tf32 = st["matmul.allow_tf32"]
    torch.use_deterministic_algorithms(st["deterministic"], warn_only=st["deterministic.warn_only"])
    if torch.get_num_threads() != st["threads"]:
        torch.set_num_threads(st["threads"])
    torch.set_grad_enabled(st["grad"])
    torch.set_default_dtype(st["dtype"])


@dataclass
class _Target:
    """What ``run_script`` runs: a script's path, a module (``-m``), or a console script's entry point."""

    argv0: str  # sys.argv[0] as python (or the console script) sets it
    args: list[str]
    path: str | None = None  # the script (or -m module) file, run as __main__
    module: str | None = None  # -m: the module runpy runs
    entry: Any = None  # a console script: its importlib.metadata EntryPoint
    files: set[str] = field(default_factory=set)  # the user's files and folders (sites, syncs)
    roots: tuple[str, ...] = ()

    def run(self) -> None:
        if self.entry is not None:  # as the console script's wrapper does: sys.exit(entrypoint())
            code = self.entry.load()()
            if code not in (None, 0):
                raise SystemExit(code)
        elif self.module is not None:
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(self.path), run_name="__main__")


def _resolve(args: list[str]) -> _Target:
    """``args`` (python's own arguments: ``train.py ARGS``, ``-m pkg ARGS``, or a command on PATH) as a ``_Target``;
    ``PttError`` with the fix when it is none of them."""
    if args[0] == "-m":
        if len(args) < 2:
            raise PttError("-m needs a module name: ptt doctor run -- python -m pkg.train ARGS")
        module = args[1]
        import importlib.util

        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            raise PttError(f"no module named {module!r} on sys.path (run from the folder that holds it)")
        path = spec.origin
        if spec.submodule_search_locations:  # a package: python -m runs its __main__
            path = os.path.join(os.path.dirname(path), "__main__.py")
        path = os.path.abspath(path)
        return _Target(path, args[2:], path=path, module=module, files={path}, roots=(os.path.dirname(path),))
    if os.path.isfile(args[0]):
        path = os.path.abspath(args[0])
        return _Target(path, args[1:], path=path, files={path}, roots=(os.path.dirname(path),))
    if os.sep in args[0]:
        raise PttError(f"{args[0]}: no such script")
    return _console_script(args[0], args[1:])


def _console_script(name: str, args: list[str]) -> _Target:
    """A command on PATH (``yolo``, ``torchrun``): a console script of this Python's packages runs its entry
    point in this process, its package's files counting as the user's (where it builds its loader, optimizer and
    model); a Python script on PATH runs as a script; anything else cannot run in-process: ``PttError``."""
    import shutil
    from importlib import metadata

    exe = shutil.which(name)
    eps = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == name]
    if eps:
        ep = eps[0]
        top = ep.value.split(":")[0].split(".")[0]
        import importlib.util

        spec = importlib.util.find_spec(top)
        roots: tuple[str, ...] = ()
        if spec is not None and spec.submodule_search_locations:
            roots = tuple(os.path.abspath(p) for p in spec.submodule_search_locations)
        elif spec is not None and spec.origin:
            roots = (os.path.dirname(os.path.abspath(spec.origin)),)
        return _Target(exe or name, args, entry=ep, roots=roots)
    if exe is not None and _python_script(exe):
        path = os.path.abspath(exe)
        return _Target(path, args, path=path, files={path}, roots=(os.path.dirname(path),))
    where = f"{exe} is not a Python script" if exe else "no such script, and no command of that name on PATH"
    raise PttError(
        f"{name}: {where} nor a console script of this Python's packages, so ptt doctor run cannot run it in its "
        "own process (it times the Python that trains). Give the Python it starts: ptt doctor run -- python "
        "train.py ARGS, or -- python -m pkg ARGS"
    )


def _python_script(path: str) -> bool:
    """Is ``path`` a text file whose first line calls python (``#!/usr/bin/env python3``)?"""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def run_script(argv: list[str], *, steps: int = 10, warmup: int = 2) -> RunReport:
    """Run ``argv`` (``["python", "train.py", ARGS...]``, ``["train.py", ...]``, ``["-m", "pkg.mod", ...]`` or a
    console script on PATH, ``["yolo", "train", ...]``) in this process, instrumented; returns the per-step split,
    the captured objects and the verdict."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    if not args:
        raise PttError("give the command after --: ptt doctor run -- python train.py ARGS")
    if steps < 1 or warmup < 0:
        raise PttError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {warmup}.")
    target = _resolve(args)
    rec = Recorder(target.files, warmup, stop_after=warmup + steps, roots=target.roots)
    report = RunReport(argv=list(argv), warmup=warmup)
    old_argv, old_path, old_cwd = sys.argv, list(sys.path), os.getcwd()
    old_state = _torch_state()
    sys.argv = [target.argv0, *target.args]
    if target.path is not None:
        sys.path.insert(0, os.path.dirname(target.path))
    rng = torch.random.fork_rng(devices=[])  # the script seeds as it likes; this process's RNG is given back
    rng.__enter__()
    try:
        with instrument(rec, sites=True):
            target.run()
        report.ended = f"the script ended after {rec.steps_text()}"
    except StopRun:
        report.ended = f"stopped after {rec.steps_text('optimizer steps')} ({warmup} warm-up + {len(rec.records)} measured)"
    except Exception as exc:
        if not is_shm_failure(exc):
            raise
        said = "; ".join(x["text"] for x in rec.shm.values() if x is not None and not x["fits"])
        raise PttError(
            f"the script's DataLoader ran out of shared memory (/dev/shm) after {rec.steps_text()}: "
            f"{exc}. {said or SHM_FIX}"
        ) from exc
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise PttError(
                f"the script exited with status {exc.code} before its first measured step"
            ) from None
        report.ended = f"the script exited after {rec.steps_text()}"
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
        os.chdir(old_cwd)
        _restore_torch_state(old_state)
        rng.__exit__(None, None, None)
    report.script = target.path or target.argv0
    collect(rec, report)
    lint_model(report)
    return report


def write_run(
    r: RunReport,
    out_dir: str,
    compared: list[str] | None = None,
    earlier_mean_s: dict[str, float] | None = None,
) -> str:
    """``out_dir/results.jsonl`` (the run with its environment, one row per measured step, the summary) and
    ``out_dir/report.html`` (with ``compared``/``earlier_mean_s``: what changed since an earlier run, its split
    beside this one's), each written atomically.
    Returns the results.jsonl path."""
    import json

    from pytorchtricks.clock import environment
    from pytorchtricks.report.html import render_doctor

    os.makedirs(out_dir, exist_ok=True)
    rows: list[dict[str, Any]] = [{"kind": "doctor-run", "argv": r.argv, "ended": r.ended, "warmup": r.warmup,
                                   "env": environment("cpu")}]  # fmt: skip
    rows += [{"kind": "doctor-step", "index": i, **st} for i, st in enumerate(r.steps)]
    rows.append({
        "kind": "doctor-summary", "mean_s": r.mean_s(), "verdict": r.verdict, "evidence": r.evidence, "fix": r.fix,
        "loaders": r.loaders, "model": r.model, "optimizer": r.optimizer, "syncs_per_step": r.syncs,
        "peak_rss_bytes": r.peak_rss_bytes, "input_shape": r.input_shape,
        "input_list": r.input_list, "first_batch": r.first_batch(), "script": r.script, "sites": r.sites,
        "lint": r.lint, "compared": compared or [], "cpu": r.cpu, "core_seconds": r.core_seconds, "busy": r.busy,
    })  # fmt: skip
    rows = json.loads(json.dumps(rows, default=str))  # what the file holds is what the page shows
    path = os.path.join(out_dir, "results.jsonl")
    for name, text in (
        ("results.jsonl", "".join(json.dumps(row) + "\n" for row in rows)),
        ("report.html", render_doctor(rows, compared, earlier_mean_s)),
    ):
        target = os.path.join(out_dir, name)
        tmp = f"{target}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    return path


def ultralytics_dataset(r: RunReport) -> Any:
    """The Ultralytics dataset the run's loader read (inside any wrappers), or None for any other dataset."""
    from pytorchtricks.analysis.step_split import inner_dataset

    ds = r.captured.get("dataset")
    if ds is None:
        return None
    inner = inner_dataset(ds)[0]
    return inner if any(c.__module__.startswith("ultralytics.") for c in type(inner).__mro__) else None


def tune_arguments(r: RunReport) -> dict[str, Any]:
    """What ``ptt tune`` needs from a run, from the script's own objects: its model (a copy), its optimizer's name
    and hyper-parameters, its dataset's folder (an ImageFolder's root; else synthetic data of its input shape), its
    batch, input shape and loader workers. Raises ``PttError`` when the run captured no model or optimizer."""
    import copy

    ds = r.captured.get("dataset")
    if ultralytics_dataset(r) is not None:
        raise PttError(
            "this run trains with Ultralytics' trainer: its tune is tune.yolo (`ptt doctor run --tune -- yolo train "
            "...` runs it), which measures its data pipeline stock and through ptt.ultralytics.accelerate(model)."
        )
    model, opt = r.captured.get("model"), r.captured.get("optimizer")
    if model is None or opt is None or len(r.input_shape) != 4:
        raise PttError(
            "the run captured no model, optimizer or input batch (did the script reach its first optimizer step?)"
        )
    keep = ("lr", "momentum", "weight_decay", "nesterov", "betas", "eps", "dampening", "alpha")
    # what it steps with: its largest parameter group's values (a trainer that gives each group its own lr
    # leaves the constructor's defaults unused)
    main = max(opt.param_groups, key=lambda g: sum(p.numel() for p in g["params"]))
    hp = {k: v for k, v in main.items() if k in keep and v is not None}
    if r.model.get("task") == "detection":
        return _detection_arguments(r, model, (type(opt).__name__.lower(), hp), ds)
    root = getattr(ds, "root", None)
    data = os.path.abspath(root) if isinstance(root, str) and os.path.isdir(root) else "synthetic"
    loader = r.loaders[0] if r.loaders else {}
    script = {
        "file": r.script, "sites": r.sites, "via": loader.get("via"), "root": data if data != "synthetic" else None,
        "transform": loader.get("transform_settings") or {}, "loader_workers": loader.get("num_workers"),
    }  # fmt: skip
    return {
        "model": copy.deepcopy(model).cpu(),
        "script": script,
        "optimizer": (type(opt).__name__.lower(), hp),
        "data": data,
        "batch_size": int(loader.get("batch_size") or r.input_shape[0]),
        "input_shape": tuple(r.input_shape[1:]),
        "num_workers": int(loader.get("num_workers") or 0),
    }


def _detection_arguments(
    r: RunReport, model: Any, optimizer: tuple[str, dict[str, Any]], ds: Any
) -> dict[str, Any]:
    """``tune_arguments`` of a detection script: its detector (a copy), its optimizer, and its CocoDetection's
    annotations and image folder as a COCO root tune reads (the annotations, as the script loaded them, written
    once under tune's cache with the image paths pointing into the script's folder)."""
    import copy
    import hashlib
    import json

    from pytorchtricks.analysis.step_split import inner_dataset
    from pytorchtricks.core import cache_root

    inner, _ = inner_dataset(ds)
    coco, root = getattr(inner, "coco", None), getattr(inner, "root", None)
    if coco is None or not isinstance(root, str) or not os.path.isdir(root):
        raise PttError(
            f"--tune on a detection script reads its torchvision CocoDetection (annotations + image folder); this "
            f"script's dataset is {type(inner).__name__}. Run `ptt tune --task detection --data ROOT --model "
            "torchvision:NAME` on your COCO / YOLO / VOC root instead."
        )
    doc = dict(coco.dataset)
    doc["images"] = [
        {**im, "file_name": os.path.join(os.path.abspath(root), im["file_name"])} for im in doc["images"]
    ]
    text = json.dumps(doc, sort_keys=True)
    folder = os.path.join(cache_root(), f"doctor-coco-{hashlib.sha256(text.encode()).hexdigest()[:16]}")
    ann = os.path.join(folder, "annotations.json")
    if not os.path.exists(ann):
        os.makedirs(folder, exist_ok=True)
        tmp = f"{ann}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, ann)
    loader = r.loaders[0] if r.loaders else {}
    script = {
        "file": r.script, "sites": r.sites, "via": loader.get("via"), "root": root,
        "transform": loader.get("transform_settings") or {}, "loader_workers": loader.get("num_workers"),
        "annotations": loader.get("annotations"),
    }  # fmt: skip
    return {
        "model": copy.deepcopy(model).cpu(),
        "script": script,
        "optimizer": optimizer,
        "data": ann,
        "batch_size": int(loader.get("batch_size") or r.input_shape[0]),
        "input_shape": None,
        "num_workers": int(loader.get("num_workers") or 0),
        "task": "detection",
    }


def read_summary(path: str) -> dict[str, Any]:
    """The summary row of an earlier run's results.jsonl; ``PttError`` when it is not one."""
    import json

    if not os.path.isfile(path):
        raise PttError(f"{path}: no such file; give the results.jsonl of an earlier `ptt doctor run`.")
    try:
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PttError(f"{path}: not a `ptt doctor run` results.jsonl ({exc}).") from None
    old = next((x for x in rows if isinstance(x, dict) and x.get("kind") == "doctor-summary"), None)
    if old is None or not isinstance(old.get("mean_s"), dict):
        raise PttError(f"{path} is not a `ptt doctor run` results.jsonl (no doctor-summary row).")
    return old


def compare_runs(before: str | dict[str, Any], r: RunReport) -> list[str]:
    """What changed from an earlier run - its results.jsonl path, or its summary as ``read_summary`` returned it -
    to ``r``: the step time, each stage's share, the loader's settings, the verdict - one line each."""
    old = read_summary(before) if isinstance(before, str) else before
    a, b = old["mean_s"], r.mean_s()
    lines = []
    if a.get("step") and b["step"]:
        lines.append(
            f"step {a['step'] * 1e3:.0f} -> {b['step'] * 1e3:.0f} ms ({a['step'] / b['step']:.2f}x the speed)"
        )
    for st in STAGES:
        sa = a[st] / a["step"] if a.get("step") else 0.0
        sb = b[st] / b["step"] if b["step"] else 0.0
        if abs(sa - sb) >= 0.05:
            lines.append(
                f"{st}: {sa:.0%} -> {sb:.0%} of the step ({a[st] * 1e3:.0f} -> {b[st] * 1e3:.0f} ms)"
            )
    la, lb = (old.get("loaders") or [{}])[0], (r.loaders or [{}])[0]
    for key in sorted(set(la) | set(lb)):
        if key != "transform" and la.get(key) != lb.get(key):
            lines.append(f"loader {key}: {la.get(key)} -> {lb.get(key)}")
    if old.get("verdict") != r.verdict:
        lines.append(f"verdict: {old.get('verdict')} -> {r.verdict}")
    return lines or ["no change beyond the noise (every stage's share within 5 points)"]
