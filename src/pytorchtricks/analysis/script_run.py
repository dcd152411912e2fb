"""``ptt doctor run -- python train.py ARGS``: the user's unmodified script, run in this process and timed per step.

The script runs as ``python`` would run it (``__main__``, ``sys.argv``, the script's folder first on ``sys.path``,
the current directory unchanged). Instrumentation goes through PyTorch's public hooks plus a few well-scoped
patches, all removed when the run ends:

- optimizer steps: the global optimizer step pre/post hooks - a step ends at each ``optimizer.step()``;
- forward: the global module forward pre/post hooks, timed on the outermost module call;
- backward: ``Tensor.backward`` / ``torch.autograd.backward``, timed;
- data wait: the time inside ``next()`` of every DataLoader iterator; the loaders' settings are recorded;
- host syncs: ``Tensor.item`` / ``cpu`` / ``numpy`` / ``tolist`` called from the script's own files, counted per
  source line.

The process-wide torch switches the script sets (cudnn, TF32, determinism, threads, grad mode, default dtype), the
RNG state, ``sys.argv``/``sys.path`` and the current directory are given back afterwards. After ``warmup`` +
``steps`` optimizer steps the run stops cleanly (an exception the script's ``except Exception``
cannot swallow); a script that ends sooner is reported as it is. The instrumentation adds time, never changes what
the script computes (tested: the same losses with and without it).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.bench.measure import now_s
from pytorchtricks.core import PttError

__all__ = ["RunReport", "compare_runs", "run_script", "tune_arguments", "write_run"]

INPUT_BOUND_SHARE = 0.30  # the step waits on its loader for more than this share: input-bound
OPTIMIZER_BOUND_SHARE = 0.30
STAGES = ("data wait", "forward", "backward", "optimizer", "other")


class _Stop(BaseException):
    """Raised from the optimizer hook after the last measured step (a BaseException: ``except Exception`` in the
    script does not catch it)."""


@dataclass
class RunReport:
    """What ``run_script`` saw: seconds per stage per measured step, the objects the script built, the verdict."""

    argv: list[str]
    steps: list[dict[str, float]] = field(default_factory=list)  # one per measured step, seconds per stage
    warmup: int = 0
    ended: str = ""  # "stopped after N steps" or "the script ended after N steps"
    loaders: list[dict[str, Any]] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    syncs: list[tuple[str, float]] = field(default_factory=list)  # (file:line, calls per measured step)
    peak_rss_bytes: int | None = None
    verdict: str = ""
    evidence: str = ""
    fix: str = ""
    input_shape: list[int] = field(default_factory=list)  # the model's first input batch (N, C, H, W)
    # the script's own objects, for `ptt doctor run --tune` (not written to results.jsonl)
    captured: dict[str, Any] = field(default_factory=dict, repr=False)

    def mean_s(self) -> dict[str, float]:
        n = max(1, len(self.steps))
        return {s: sum(st[s] for st in self.steps) / n for s in (*STAGES, "step")}


class _Recorder:
    def __init__(self, script_files: set[str], warmup: int, steps: int) -> None:
        self.files = script_files
        self.warmup, self.steps = warmup, steps
        self.done = 0
        self.cur: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.start = now_s()
        self.depth = 0
        self.fwd_start = 0.0
        self.opt_start = 0.0
        self.records: list[dict[str, float]] = []
        self.loaders: dict[int, Any] = {}
        self.models: dict[int, Any] = {}
        self.optimizers: dict[int, Any] = {}
        self.syncs: Counter[str] = Counter()
        self.measuring = warmup == 0
        self.inside: dict[str, bool] = {}
        self.shapes: dict[int, list[int]] = {}  # the first input batch each outermost model saw

    # -- hooks
    def forward_pre(self, module: Any, args: Any) -> None:
        if self.inside.get(
            "data wait"
        ):  # torchvision transforms are nn.Modules: called by the loader, not the step
            return
        if self.depth == 0:
            self.fwd_start = now_s()
            if any(True for _ in module.parameters()):
                self.models.setdefault(id(module), module)
                x = args[0] if args else None
                if isinstance(x, torch.Tensor) and id(module) not in self.shapes:
                    self.shapes[id(module)] = list(x.shape)
        self.depth += 1

    def forward_post(self, module: Any, args: Any, out: Any) -> None:
        if self.inside.get("data wait"):
            return
        self.depth = max(0, self.depth - 1)
        if self.depth == 0:
            self.cur["forward"] += now_s() - self.fwd_start

    def optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.optimizers.setdefault(id(opt), opt)
        self.opt_start = now_s()

    def optimizer_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        t = now_s()
        self.cur["optimizer"] += t - self.opt_start
        total = t - self.start
        timed = sum(self.cur[s] for s in STAGES if s != "other")
        self.cur["other"] = max(0.0, total - timed)
        if self.done >= self.warmup:
            self.records.append({**self.cur, "step": total})
        self.done += 1
        self.measuring = self.done >= self.warmup
        self.cur = dict.fromkeys(STAGES, 0.0)
        self.start = now_s()
        if self.done >= self.warmup + self.steps:
            raise _Stop()

    def timed(self, stage: str, fn: Any) -> Any:
        """``fn`` timed into ``stage``; nested calls count once (``Tensor.backward`` calls ``autograd.backward``)."""
        rec = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if rec.inside.get(stage):
                return fn(*args, **kwargs)
            rec.inside[stage] = True
            t = now_s()
            try:
                return fn(*args, **kwargs)
            finally:
                rec.cur[stage] += now_s() - t
                rec.inside[stage] = False

        return wrapper

    def sync(self, name: str, fn: Any) -> Any:
        rec = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if rec.measuring:
                frame = sys._getframe(1)
                if os.path.abspath(frame.f_code.co_filename) in rec.files:
                    rec.syncs[f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} .{name}()"] += 1
            return fn(*args, **kwargs)

        return wrapper


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


def _loader_settings(loader: Any) -> dict[str, Any]:
    ds = loader.dataset
    kind = type(ds).__name__
    transform = getattr(ds, "transform", None)
    return {
        "dataset": kind,
        "samples": len(ds) if hasattr(ds, "__len__") else None,
        "root": getattr(ds, "root", None),
        "transform": repr(transform).replace("\n", " ") if transform is not None else None,
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
    }


def run_script(argv: list[str], *, steps: int = 10, warmup: int = 2) -> RunReport:
    """Run ``argv`` (``["python", "train.py", ARGS...]``, ``["train.py", ...]`` or ``["-m", "pkg.mod", ...]``)
    in this process, instrumented; returns the per-step split, the captured objects and the verdict."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    if not args:
        raise PttError("give the command after --: ptt doctor run -- python train.py ARGS")
    if steps < 1 or warmup < 0:
        raise PttError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {warmup}.")
    module = None
    if args[0] == "-m":
        if len(args) < 2:
            raise PttError("-m needs a module name: ptt doctor run -- python -m pkg.train ARGS")
        module, script_args = args[1], args[2:]
        spec = __import__("importlib.util").util.find_spec(module)
        if spec is None or spec.origin is None:
            raise PttError(f"no module named {module!r} on sys.path")
        path = spec.origin
    else:
        path, script_args = args[0], args[1:]
        if not os.path.isfile(path):
            raise PttError(f"{path}: no such script")
    path = os.path.abspath(path)
    rec = _Recorder({path}, warmup, steps)
    report = RunReport(argv=list(argv), warmup=warmup)
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, new: Any) -> None:
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om
    from torch.utils.data import dataloader as dl

    handles = [
        mm.register_module_forward_pre_hook(rec.forward_pre),
        mm.register_module_forward_hook(rec.forward_post),
        om.register_optimizer_step_pre_hook(rec.optimizer_pre),
        om.register_optimizer_step_post_hook(rec.optimizer_post),
    ]
    base_iter = dl._BaseDataLoaderIter
    orig_next = base_iter.__next__
    orig_iter = dl.DataLoader.__iter__

    def loader_iter(self: Any) -> Any:
        rec.loaders.setdefault(id(self), self)
        return orig_iter(self)

    patch(base_iter, "__next__", rec.timed("data wait", orig_next))
    patch(dl.DataLoader, "__iter__", loader_iter)
    patch(torch.Tensor, "backward", rec.timed("backward", torch.Tensor.backward))
    patch(torch.autograd, "backward", rec.timed("backward", torch.autograd.backward))
    for name in ("item", "cpu", "numpy", "tolist"):
        patch(torch.Tensor, name, rec.sync(name, getattr(torch.Tensor, name)))
    old_argv, old_path, old_cwd = sys.argv, list(sys.path), os.getcwd()
    old_state = _torch_state()
    sys.argv = [path, *script_args]
    sys.path.insert(0, os.path.dirname(path))
    rng = torch.random.fork_rng(devices=[])  # the script seeds as it likes; this process's RNG is given back
    rng.__enter__()
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(path, run_name="__main__")
        report.ended = f"the script ended after {rec.done} optimizer step(s)"
    except _Stop:
        report.ended = f"stopped after {rec.done} optimizer steps ({warmup} warm-up + {steps} measured)"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise PttError(
                f"the script exited with status {exc.code} before its first measured step"
            ) from None
        report.ended = f"the script exited after {rec.done} optimizer step(s)"
    finally:
        for h in handles:
            h.remove()
        for owner, name, old in reversed(patches):
            setattr(owner, name, old)
        sys.argv, sys.path[:] = old_argv, old_path
        os.chdir(old_cwd)
        _restore_torch_state(old_state)
        rng.__exit__(None, None, None)
    report.steps = rec.records
    report.loaders = [_loader_settings(x) for x in rec.loaders.values()]
    if rec.models:
        m = max(rec.models.values(), key=lambda mod: sum(p.numel() for p in mod.parameters()))
        report.model = {"class": type(m).__name__, "params": sum(p.numel() for p in m.parameters())}
        report.input_shape = rec.shapes.get(id(m), [])
        report.captured["model"] = m
    if rec.optimizers:
        o = next(iter(rec.optimizers.values()))
        hp = {k: v for k, v in o.defaults.items() if isinstance(v, int | float | bool) and k in ("lr", "momentum",
              "weight_decay", "nesterov", "foreach", "fused")}  # fmt: skip
        report.optimizer = {"class": type(o).__name__, **hp}
        report.captured["optimizer"] = o
    if rec.loaders:
        report.captured["dataset"] = next(iter(rec.loaders.values())).dataset
    n = max(1, len(rec.records))
    report.syncs = sorted(((k, v / n) for k, v in rec.syncs.items()), key=lambda kv: -kv[1])
    try:
        import resource

        report.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        report.peak_rss_bytes = None
    _verdict(report)
    return report


def _verdict(r: RunReport) -> None:
    if not r.steps:
        r.verdict, r.evidence = (
            "unknown",
            f"no optimizer step was measured ({r.ended}); raise the script's steps",
        )
        r.fix = "run it for more than --warmup steps"
        return
    m = r.mean_s()
    share = {s: m[s] / m["step"] if m["step"] else 0.0 for s in STAGES}
    split = ", ".join(f"{s} {m[s] * 1e3:.0f} ms ({share[s]:.0%})" for s in STAGES)
    r.evidence = f"mean step {m['step'] * 1e3:.0f} ms over {len(r.steps)} steps: {split}"
    train = [x for x in r.loaders if x["num_workers"] is not None]
    loader = train[0] if train else None
    if share["data wait"] > INPUT_BOUND_SHARE:
        r.verdict = "input-bound"
        workers = loader["num_workers"] if loader else "?"
        root = loader.get("root") if loader else None
        r.fix = (
            f"the step waits {share['data wait']:.0%} of its time for the DataLoader ({workers} workers): "
            "give it workers (DataLoader(num_workers=N)) or read through ptt.make_loader (crop-aware scaled decode)"
            + (f"; `ptt tune --data {root}` measures which, and a RAM cache or a pack" if root else "")
        )
    elif share["optimizer"] > OPTIMIZER_BOUND_SHARE:
        r.verdict = "optimizer-bound"
        r.fix = "ptt.fast_optimizer(model.parameters(), ...) (fused/foreach, the same update)"
    elif r.syncs and any(v >= 1 for _, v in r.syncs) and torch.cuda.is_available():
        r.verdict = "sync-bound"
        r.fix = f"host syncs every step at {r.syncs[0][0]}: accumulate on the device, read every K steps"
    else:
        r.verdict = "compute-bound"
        r.fix = "the model itself: ptt tune on it (precision, channels_last, compile), or ptt profile for its top ops"


def write_run(r: RunReport, out_dir: str) -> str:
    """``out_dir/results.jsonl``: the run (argv, environment), one row per measured step, the summary; written
    atomically. Returns the file's path."""
    import json

    from pytorchtricks.bench.measure import environment

    os.makedirs(out_dir, exist_ok=True)
    rows: list[dict[str, Any]] = [{"kind": "doctor-run", "argv": r.argv, "ended": r.ended, "warmup": r.warmup,
                                   "env": environment("cpu")}]  # fmt: skip
    rows += [{"kind": "doctor-step", "index": i, **st} for i, st in enumerate(r.steps)]
    rows.append({
        "kind": "doctor-summary", "mean_s": r.mean_s(), "verdict": r.verdict, "evidence": r.evidence, "fix": r.fix,
        "loaders": r.loaders, "model": r.model, "optimizer": r.optimizer, "syncs_per_step": r.syncs,
        "peak_rss_bytes": r.peak_rss_bytes, "input_shape": r.input_shape,
    })  # fmt: skip
    path = os.path.join(out_dir, "results.jsonl")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, default=str) + "\n" for row in rows)
    os.replace(tmp, path)
    return path


def tune_arguments(r: RunReport) -> dict[str, Any]:
    """What ``ptt tune`` needs from a run, from the script's own objects: its model (a copy), its optimizer's name
    and hyper-parameters, its dataset's folder (an ImageFolder's root; else synthetic data of its input shape), its
    batch, input shape and loader workers. Raises ``PttError`` when the run captured no model or optimizer."""
    import copy

    model, opt = r.captured.get("model"), r.captured.get("optimizer")
    if model is None or opt is None or len(r.input_shape) != 4:
        raise PttError(
            "the run captured no model, optimizer or input batch (did the script reach its first optimizer step?)"
        )
    keep = ("lr", "momentum", "weight_decay", "nesterov", "betas", "eps", "dampening", "alpha")
    hp = {k: v for k, v in opt.defaults.items() if k in keep and v is not None}
    ds = r.captured.get("dataset")
    root = getattr(ds, "root", None)
    data = root if isinstance(root, str) and os.path.isdir(root) else "synthetic"
    loader = r.loaders[0] if r.loaders else {}
    return {
        "model": copy.deepcopy(model).cpu(),
        "optimizer": (type(opt).__name__.lower(), hp),
        "data": data,
        "batch_size": int(loader.get("batch_size") or r.input_shape[0]),
        "input_shape": tuple(r.input_shape[1:]),
        "num_workers": int(loader.get("num_workers") or 0),
    }


def compare_runs(before_path: str, r: RunReport) -> list[str]:
    """What changed from the run saved at ``before_path`` (its results.jsonl) to ``r``: the step time, each stage's
    share, the loader's settings, the verdict - one line each."""
    import json

    if not os.path.isfile(before_path):
        raise PttError(f"{before_path}: no such file; give the results.jsonl of an earlier `ptt doctor run`.")
    with open(before_path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    old = next((x for x in rows if x.get("kind") == "doctor-summary"), None)
    if old is None:
        raise PttError(f"{before_path} is not a `ptt doctor run` results.jsonl (no doctor-summary row).")
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
