"""The per-step split of a training loop: a recorder behind PyTorch's public hooks, and what it saw.

Both ``ptt doctor run`` (the user's unmodified script) and ``ptt.watch`` (inside the user's own loop) install it:

- steps: the global optimizer step pre/post hooks - a step ends at each ``optimizer.step()``, or, in a loop that
  accumulates gradients over several batches, when the next batch is drawn after a backward (a step is one batch);
- forward: the global module forward pre/post hooks, timed on the outermost module call;
- backward: ``Tensor.backward`` / ``torch.autograd.backward``, timed;
- data wait: the time inside ``next()`` of every DataLoader iterator, however it was made (``iter(loader)``, a
  subclass's own ``__iter__``, an iterable wrapped around the loader); the loaders' settings are recorded;
- which objects are the loop's: the optimizer that took the most steps, the model whose parameters it updates,
  the loader drawn from in the most trained steps, the model's first input of a trained forward (grad enabled,
  after a loader batch was drawn: a stride probe or a warm-up under ``no_grad`` is not the first batch);
- host syncs: ``Tensor.item`` / ``cpu`` / ``numpy`` / ``tolist`` called from the user's own files, counted per
  source line;
- where the script built its loader, optimizer and model, and where it calls backward (file:line), so that advice
  can point at the line to change.

Every hook and patch is removed when the ``instrument`` block ends, whatever happens inside it.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.analysis import verdict as judge
from pytorchtricks.analysis.loader_shm import dataloader_shm
from pytorchtricks.clock import CpuMeter, CpuUse, now_s
from pytorchtricks.core import PttWarning

__all__ = [
    "STAGES",
    "RunReport",
    "Recorder",
    "collect",
    "instrument",
    "lint_model",
    "optimizer_settings",
    "optimizer_text",
    "transform_settings",
    "verdict",
]

OPTIMIZER_BOUND_SHARE = 0.30  # a refinement of compute-bound: the optimizer's own kernels take this share
STAGES = ("data wait", "forward", "backward", "optimizer", "other")


class StopRun(BaseException):
    """Raised from the optimizer hook after the last measured step (a BaseException: ``except Exception`` in the
    script does not catch it)."""


@dataclass
class RunReport:
    """What a run showed: seconds per stage per measured step, the objects the loop used, the verdict."""

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
    # a model called on a list of images (a detector): each image's (C, H, W); input_shape is then (N, C, Hmax, Wmax)
    input_list: list[list[int]] = field(default_factory=list)
    script: str = ""  # the script's path (``ptt doctor run``)
    lint: list[dict[str, Any]] = field(
        default_factory=list
    )  # ``ptt lint`` on the model at its real input shape
    # where the script builds what advice changes: {"loader"|"optimizer"|"model"|"backward": {file, line, code}}
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the loop's own objects, for `ptt doctor run --tune` (not written to results.jsonl)
    captured: dict[str, Any] = field(default_factory=dict, repr=False)
    # who used the CPU over the measured steps (clock.CpuUse.as_dict()) and the CPU-seconds per step of the
    # training process and its loader workers (analysis.verdict.CoreSeconds.as_dict())
    cpu: dict[str, Any] = field(default_factory=dict)
    core_seconds: dict[str, Any] = field(default_factory=dict)
    busy: str | None = None  # other programs took cores the step needs (analysis.verdict.machine_busy)

    def first_batch(self) -> str:
        """The model's first input as a person reads it: ``32x3x224x224``, or a detector's list of images."""
        return first_batch_text(self.input_shape, self.input_list)

    def mean_s(self) -> dict[str, float]:
        n = max(1, len(self.steps))
        return {s: sum(st[s] for st in self.steps) / n for s in (*STAGES, "step")}


class Recorder:
    """The hooks' state. ``files``: the user's source files, ``roots``: folders whose files (not in a
    site-packages below the folder) are the user's too - syncs and sites are counted from them only;
    ``model`` / ``optimizer`` / ``loader``: when given, only these are timed (``ptt.watch``); ``stop_after``:
    raise ``StopRun`` after that many optimizer steps (``ptt doctor run``)."""

    def __init__(
        self,
        files: set[str],
        warmup: int,
        stop_after: int | None = None,
        *,
        roots: tuple[str, ...] = (),
        model: Any = None,
        optimizer: Any = None,
        loader: Any = None,
    ) -> None:
        self.files = {os.path.abspath(f) for f in files}
        self.roots = tuple(os.path.join(os.path.abspath(r), "") for r in roots)
        self._mine: dict[str, bool] = {}
        self.warmup, self.stop_after = warmup, stop_after
        self.only_model, self.only_optimizer = model, optimizer
        dl = getattr(loader, "dataloader", loader)  # ptt.make_loader's Loader wraps one DataLoader
        self.only_loader = dl
        self.done = 0
        self.cur: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.start = now_s()
        self.depth = 0
        self.fwd_start = 0.0
        self.fwd_timed = False
        self.opt_start = 0.0
        self.records: list[dict[str, float]] = []
        self.loaders: dict[int, Any] = {} if dl is None else {id(dl): dl}
        self.shm: dict[int, dict[str, Any] | None] = {}  # loader id -> /dev/shm against its batches in flight
        self.iters: dict[int, Any] = {}  # iterator id -> its loader
        self.models: dict[int, Any] = {} if model is None else {id(model): model}
        self.optimizers: dict[int, Any] = {} if optimizer is None else {id(optimizer): optimizer}
        self.syncs: Counter[str] = Counter()  # over the measured steps
        self.step_syncs: Counter[str] = Counter()  # in the step under way (kept if it is measured)
        self.inside: dict[str, bool] = {}
        self.shapes: dict[int, list[int]] = {}  # the first input batch each outermost model saw
        self.sites: dict[tuple[str, int], dict[str, Any]] = {}  # (kind, id) -> where it was built / called
        # CPU-seconds of this process and its loader workers over the measured steps (from the first measured
        # step's start to the last one's end)
        self.list_inputs: dict[int, list[list[int]]] = {}  # a model called on a list of images: their shapes
        self.outputs: dict[int, list[str]] = {}  # a model that returns a dict (a detector's losses): its keys
        self.annotations: dict[int, str] = {}  # a CocoDetection's id -> the annotation file it was built from
        self.meter: CpuMeter | None = CpuMeter().__enter__() if warmup == 0 else None
        self.opt_steps: Counter[int] = Counter()  # optimizer id -> steps it took
        self.backwards = 0  # backward calls in the step under way
        self.drawn: set[int] = set()  # loaders drawn from in the step under way
        self.step_draws: Counter[int] = Counter()  # loader id -> trained steps (with a backward) it fed
        self.any_drawn = False  # a loader batch has been drawn: forwards before it are probes
        self.shape_rank: dict[int, int] = {}  # model id -> how trustworthy its recorded first input is (0-2)
        self.cpu: CpuUse | None = None
        self.cpu_steps = 0

    def restart(self) -> None:
        """Time the next step from now (``ptt.watch`` entering its block)."""
        self.start = now_s()
        self.cur = dict.fromkeys(STAGES, 0.0)

    # -- where in the user's files
    def mine(self, filename: str) -> bool:
        """Is ``filename`` (a code object's) one of the user's own files?"""
        hit = self._mine.get(filename)
        if hit is None:
            path = os.path.abspath(filename)
            hit = path in self.files or (
                path.endswith(".py")
                and any(path.startswith(r) and "site-packages" not in path[len(r) :] for r in self.roots)
            )
            self._mine[filename] = hit
        return hit

    def caller_frame(self, depth: int = 2) -> Any:
        """The innermost frame of the user's own files on the stack, or None."""
        frame: Any = sys._getframe(depth)
        while frame is not None and not self.mine(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def caller(self, depth: int = 2) -> dict[str, Any] | None:
        """The innermost frame of the user's own files on the stack: ``{file, line, code}`` or None."""
        frame = self.caller_frame(depth + 1)
        if frame is None:
            return None
        path = os.path.abspath(frame.f_code.co_filename)
        return {"file": path, "line": frame.f_lineno, "code": linecache.getline(path, frame.f_lineno).strip()}

    def site(self, kind: str, obj: Any, *, first: bool = False) -> None:
        key = (kind, id(obj))
        if first and key in self.sites:
            return
        where = self.caller(3)
        if where is not None:
            self.sites[key] = where

    def loader_parts(self, loader: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Where the user's file made the dataset and the (batch) sampler a DataLoader is built with: the line
        that assigned the name the loader's call passes them by (``assignment_site``)."""
        frame = self.caller_frame(3)
        if frame is None:
            return
        parts = {
            "dataset": kwargs.get("dataset", args[0] if args else None),
            "sampler": kwargs.get("batch_sampler") or kwargs.get("sampler"),
        }
        for kind, obj in parts.items():
            where = assignment_site(frame, obj) if obj is not None else None
            if where is not None:
                self.sites[(kind, id(loader))] = where

    # -- hooks
    def forward_pre(self, module: Any, args: Any) -> None:
        if self.inside.get("data wait"):  # torchvision transforms are nn.Modules: called by the loader
            return
        if self.depth == 0:
            self.fwd_timed = self.only_model is None or module is self.only_model
            if self.fwd_timed:
                self.fwd_start = now_s()
                if any(True for _ in module.parameters()):
                    self.models.setdefault(id(module), module)
                    self.first_input(module, args[0] if args else None)
        self.depth += 1

    def first_input(self, module: Any, x: Any) -> None:
        """Record ``x`` as ``module``'s first input unless a more trustworthy one is recorded: a trained forward
        (grad enabled, after a loader batch was drawn) outranks a forward with grad before any batch (a warm-up),
        which outranks one without grad (a stride probe, ``model.info()``). A dict (a trainer's batch) gives its
        largest tensor."""
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        rank = 2 if grad and self.any_drawn else 1 if grad else 0
        if rank <= self.shape_rank.get(id(module), -1):
            return
        if isinstance(x, dict):
            x = max((t for t in x.values() if isinstance(t, torch.Tensor)), key=torch.numel, default=None)
        if isinstance(x, torch.Tensor):
            self.shapes[id(module)] = list(x.shape)
            self.list_inputs.pop(id(module), None)
        elif _tensor_list(x):  # a detector: a list of images
            self.shapes[id(module)] = [len(x), *(max(t.shape[d] for t in x) for d in range(x[0].dim()))]
            self.list_inputs[id(module)] = [list(t.shape) for t in x]
        else:
            return
        self.shape_rank[id(module)] = rank
        self.site("call", module)

    def forward_post(self, module: Any, args: Any, out: Any) -> None:
        if (
            self.depth == 1
            and isinstance(out, dict)
            and id(module) in self.models
            and id(module) not in self.outputs
        ):
            self.outputs[id(module)] = [str(k) for k in out]  # a detector in training mode: its loss dict
        if self.inside.get("data wait"):
            return
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.fwd_timed:
            self.cur["forward"] += now_s() - self.fwd_start

    def _ours(self, opt: Any) -> bool:
        return self.only_optimizer is None or opt is self.only_optimizer

    def optimizer_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._ours(opt):
            self.optimizers.setdefault(id(opt), opt)
            self.opt_start = now_s()

    def optimizer_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self._ours(opt):
            return
        t = now_s()
        self.cur["optimizer"] += t - self.opt_start
        self.opt_steps[id(opt)] += 1
        self.close(t)

    def draw(self, it: Any) -> None:
        """A tracked loader iterator is about to give a batch: in a loop that accumulates gradients (a backward
        since the last step ended, no optimizer step yet) the step ended here - one step is one batch."""
        loader = self.iters.get(id(it))
        if self.backwards:
            self.close(now_s())
        self.any_drawn = True
        if loader is not None:
            self.drawn.add(id(loader))

    def close(self, t: float) -> None:
        """End the step under way at ``t``: keep it if measured; ``StopRun`` after the last one."""
        if self.backwards:
            self.step_draws.update(self.drawn)
        self.backwards, self.drawn = 0, set()
        total = t - self.start
        timed = sum(self.cur[s] for s in STAGES if s != "other")
        self.cur["other"] = max(0.0, total - timed)
        if self.done >= self.warmup:
            self.records.append({**self.cur, "step": total})
            self.syncs += self.step_syncs
        self.done += 1
        self.step_syncs = Counter()
        # a loop that accumulates gradients runs on to its first optimizer step: that is how the run knows which
        # optimizer (and so which model) is the loop's
        if self.stop_after is not None and self.done >= self.stop_after and self.opt_steps:
            self.stop_meter()
            raise StopRun()
        if self.done == self.warmup and self.meter is None:  # the measured steps start now
            self.meter = CpuMeter().__enter__()
        self.restart()

    def steps_text(self, unit: str = "optimizer step(s)") -> str:
        """``N optimizer step(s)``, or in a loop that accumulates gradients ``N steps of one batch (K optimizer
        step(s): ...)``."""
        k = sum(self.opt_steps.values())
        if k == self.done:
            return f"{self.done} {unit}"
        return f"{self.done} steps of one batch ({k} optimizer step(s): the loop accumulates gradients)"

    def stop_meter(self) -> None:
        """End the CPU accounting at the last measured step (``collect`` calls it too: a script that ended)."""
        if self.meter is not None and self.cpu is None:
            self.meter.__exit__(None, None, None)
            self.cpu, self.cpu_steps = self.meter.result, len(self.records)

    def count_backward(self) -> None:
        self.backwards += 1

    def timed(self, stage: str, fn: Any, keep: Any = None) -> Any:
        """``fn`` timed into ``stage``; nested calls count once (``Tensor.backward`` calls ``autograd.backward``).
        ``keep(args)``: time only the calls it accepts (the watched loader's iterator)."""
        rec = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if rec.inside.get(stage) or (keep is not None and not keep(args)):
                return fn(*args, **kwargs)
            if stage == "backward":
                rec.site("backward", None, first=True)
                rec.count_backward()
            elif stage == "data wait":
                rec.draw(args[0])
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
            frame = sys._getframe(1)
            if rec.mine(frame.f_code.co_filename):
                rec.step_syncs[
                    f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} .{name}()"
                ] += 1
            return fn(*args, **kwargs)

        return wrapper


@contextlib.contextmanager
def instrument(rec: Recorder, *, sites: bool = False) -> Iterator[Recorder]:
    """Install ``rec``'s hooks and patches for the block; all removed at its end. ``sites``: also record where
    the user's files build DataLoaders, optimizers and modules (``ptt doctor run``: the objects do not exist yet)."""
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om
    from torch.utils.data import dataloader as dl

    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, new: Any) -> None:
        patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    handles = [
        mm.register_module_forward_pre_hook(rec.forward_pre),
        mm.register_module_forward_hook(rec.forward_post),
        om.register_optimizer_step_pre_hook(rec.optimizer_pre),
        om.register_optimizer_step_post_hook(rec.optimizer_post),
    ]
    base_iter = dl._BaseDataLoaderIter
    orig_iter_init = base_iter.__init__

    def check_shm(loader: Any) -> None:
        if (rec.only_loader is None or loader is rec.only_loader) and id(loader) not in rec.shm:
            rec.shm[id(loader)] = shm = dataloader_shm(loader)  # before its workers start: they may not
            if shm is not None and not shm["fits"]:
                warnings.warn(f"ptt: a DataLoader of this run: {shm['text']}.", PttWarning, stacklevel=3)

    def iter_init(self: Any, loader: Any) -> None:
        # every iterator of a DataLoader starts here, also one a subclass makes in its own __iter__ (a repeating
        # loader's ``_get_iterator()``) - and before its workers start
        check_shm(loader)
        orig_iter_init(self, loader)
        if rec.only_loader is None or loader is rec.only_loader:
            rec.loaders.setdefault(id(loader), loader)
            rec.iters[id(self)] = loader

    patch(
        base_iter,
        "__next__",
        rec.timed("data wait", base_iter.__next__, keep=lambda a: id(a[0]) in rec.iters),
    )
    patch(base_iter, "__init__", iter_init)
    patch(torch.Tensor, "backward", rec.timed("backward", torch.Tensor.backward))
    patch(torch.autograd, "backward", rec.timed("backward", torch.autograd.backward))
    for name in ("item", "cpu", "numpy", "tolist"):
        patch(torch.Tensor, name, rec.sync(name, getattr(torch.Tensor, name)))
    if sites:
        for owner, kind in ((dl.DataLoader, "loader"), (om.Optimizer, "optimizer"), (mm.Module, "model")):
            patch(owner, "__init__", _site_init(rec, kind, owner.__init__))
        coco = _coco_class()
        if coco is not None:  # the annotation file a CocoDetection reads (the object keeps only its contents)
            patch(coco, "__init__", _annotation_init(rec, coco.__init__))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
        for owner, name, old in reversed(patches):
            setattr(owner, name, old)


def _site_init(rec: Recorder, kind: str, init: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        rec.site(kind, self)
        if kind == "loader":
            rec.loader_parts(self, args, kwargs)
        init(self, *args, **kwargs)

    return wrapper


def _coco_class() -> Any:
    """torchvision's ``CocoDetection`` (None without torchvision)."""
    try:
        from torchvision.datasets import coco
    except ImportError:
        return None
    return coco.CocoDetection


def _annotation_init(rec: Recorder, init: Any) -> Any:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        ann = kwargs.get("annFile", args[1] if len(args) > 1 else None)
        if isinstance(ann, str | os.PathLike):
            rec.annotations[id(self)] = os.path.abspath(os.fspath(ann))
        init(self, *args, **kwargs)

    return wrapper


_TREES: dict[str, Any] = {}
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _tree(path: str) -> Any:
    """The parsed source of ``path`` (cached; None when it does not parse)."""
    if path not in _TREES:
        try:
            _TREES[path] = ast.parse("".join(linecache.getlines(path)))
        except (SyntaxError, ValueError):
            _TREES[path] = None
    return _TREES[path]


def assignment_site(frame: Any, obj: Any) -> dict[str, Any] | None:
    """``{file, line, code}`` of the statement in ``frame``'s function that assigned ``obj`` to the local name
    it has there (``train_batch_sampler = GroupedBatchSampler(...)``), before the frame's current line; None when
    no local name holds it or the source does not show the assignment. Of several such statements (an if / else),
    the one that names ``obj``'s class is preferred, then the latest."""
    names = {n for n, v in frame.f_locals.items() if v is obj}
    path = os.path.abspath(frame.f_code.co_filename)
    tree = _tree(path) if names else None
    if tree is None:
        return None
    line, first = frame.f_lineno, frame.f_code.co_firstlineno
    scope: Any = tree
    for node in ast.walk(tree):  # the function the frame runs (module code: the whole file)
        starts = [node.lineno, *(d.lineno for d in node.decorator_list)] if isinstance(node, _FUNCS) else []
        if first in starts:
            scope = node
    found = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.lineno < line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if bound & names:
                code = "".join(linecache.getlines(path)[node.lineno - 1 : node.end_lineno or node.lineno])
                found.append((type(obj).__name__ + "(" in code, node.lineno))
    if not found:
        return None
    best = max(found)[1]
    return {"file": path, "line": best, "code": linecache.getline(path, best).strip()}


def transform_settings(transform: Any) -> dict[str, Any]:
    """The settings of a torchvision transform pipeline that ``ptt.make_loader`` can keep: crop size, scale and
    ratio of a RandomResizedCrop (train) or Resize + CenterCrop (eval), a horizontal flip, Normalize's mean/std."""
    from torchvision import transforms as T

    out: dict[str, Any] = {}
    parts = list(getattr(transform, "transforms", [transform])) if transform is not None else []
    for t in parts:
        if isinstance(t, T.RandomResizedCrop):
            out.update(
                mode="train", crop=list(t.size), scale=list(t.scale), ratio=[round(r, 4) for r in t.ratio]
            )
        elif isinstance(t, T.Resize) and isinstance(t.size, int | list | tuple):
            out.update(mode="eval", resize=t.size if isinstance(t.size, int) else list(t.size))
        elif isinstance(t, T.CenterCrop):
            out["crop"] = list(t.size)
        elif isinstance(t, T.RandomHorizontalFlip):
            out["flip"] = True
        elif isinstance(t, T.Normalize):
            out.update(mean=[float(v) for v in t.mean], std=[float(v) for v in t.std])
    return out


# torchvision's detection datasets and the detectors that train on them (their forward takes a list of images and,
# in training mode, the targets, and returns a dict of losses)
DETECTION_DATASETS = ("CocoDetection", "VOCDetection", "WIDERFace", "Kitti", "DetectionDataset")
DETECTORS = ("GeneralizedRCNN", "RetinaNet", "FCOS", "SSD")


def first_batch_text(shape: list[int], images: list[list[int]] | None = None) -> str:
    if images:
        sizes = ", ".join("x".join(map(str, im)) for im in images[:4]) + (" ..." if len(images) > 4 else "")
        return f"a list of {len(images)} image(s) ({sizes})"
    return "x".join(map(str, shape)) or "?"


def _tensor_list(x: Any) -> bool:
    return isinstance(x, list | tuple) and bool(x) and all(isinstance(t, torch.Tensor) for t in x)


def model_task(model: Any) -> str | None:
    """``"detection"`` for a torchvision detector (by its class hierarchy), else None."""
    names = {c.__name__ for c in type(model).__mro__}
    return "detection" if names & set(DETECTORS) else None


def inner_dataset(ds: Any) -> tuple[Any, list[str]]:
    """The dataset inside a ``Subset`` and torchvision's transforms-v2 wrapper (``wrap_dataset_for_transforms_v2``),
    and the wrappers' names, outermost first: a doctor names ``CocoDetection``, not ``Subset``."""
    layers = _layers(ds)
    return layers[-1][0], [name for _, name in layers[:-1]]


def _layers(ds: Any) -> list[tuple[Any, str]]:
    """``ds`` and the datasets it wraps (``Subset``, the transforms-v2 wrapper), outermost first, each with the
    wrapper's name (the innermost: "")."""
    out = []
    for _ in range(8):
        inner, name = None, ""
        cls = type(ds).__name__
        if isinstance(ds, torch.utils.data.Subset):
            inner, name = ds.dataset, "Subset"
        elif hasattr(ds, "_dataset") and (cls.endswith("Wrapper") or cls.startswith("Wrapped")):
            inner, name = ds._dataset, "the transforms-v2 wrapper"  # torchvision's WrappedCocoDetection
        if inner is None:
            break
        out.append((ds, name))
        ds = inner
    return [*out, (ds, "")]


def _transform_of(ds: Any) -> Any:
    """A dataset's transforms: ``transform`` / ``transforms``, or ``_transforms`` (the detection reference's own
    CocoDetection subclass); torchvision's transforms-v2 wrapper takes them off the dataset it wraps onto itself."""
    for name in ("transform", "transforms", "_transforms"):
        t = getattr(ds, name, None)
        if t is not None:
            return t
    return None


def transform_steps(transform: Any, depth: int = 0) -> list[str]:
    """The class names of a transform pipeline's steps, nested Composes and presets flattened (torchvision's v1 /
    v2 ``Compose``, the detection reference's ``DetectionPresetTrain`` and its own ``Compose``: ``.transforms``)."""
    if transform is None or depth > 6:
        return []
    inner = getattr(transform, "transforms", None)
    if isinstance(inner, list | tuple):
        return [n for t in inner for n in transform_steps(t, depth + 1)]
    if inner is not None and inner is not transform:
        return transform_steps(inner, depth + 1)
    return [type(transform).__name__]


# The detection reference's train policies (references/detection/presets.py), told by the step that resizes or
# crops; none of them: "hflip" - full-size images, which the detector's own transform then resizes
_POLICIES = (
    ("ScaleJitter", "lsj"),
    ("FixedSizeCrop", "lsj"),
    ("RandomShortestSize", "multiscale"),
    ("RandomZoomOut", "ssd"),
    ("RandomIoUCrop", "ssdlite"),
)


def detection_policy(transform: Any) -> str | None:
    """A detection dataset's train policy in words: the detection reference's name for it (``hflip``,
    ``multiscale``, ``lsj``, ``ssd``, ``ssdlite``) and its steps, or None when it has no transforms."""
    steps = transform_steps(transform)
    if not steps:
        return None
    name = next((p for step, p in _POLICIES if step in steps), None)
    if name is None:
        resizes = [s for s in steps if "Resize" in s or "Crop" in s or "Size" in s]
        name = "hflip: full-size images, resized by the detector's own transform" if not resizes else "custom"
    return f"{name} ({', '.join(steps)})"


def loader_settings(loader: Any) -> dict[str, Any]:
    """A DataLoader's settings and its dataset's kind (``ptt.make_loader``'s own loader is named as such)."""
    from pytorchtricks.data.batches import BatchDataset, StreamBatches

    ds = loader.dataset
    batch = loader.batch_size
    sampler = None
    if (
        batch is None and loader.batch_sampler is not None
    ):  # a batch sampler of the script's own (aspect groups)
        bs = loader.batch_sampler
        sampler = type(bs).__name__
        batch = getattr(bs, "batch_size", None)
    via = "DataLoader"
    layers = _layers(ds)  # whichever layer holds the transforms: the v2 wrapper takes them off the dataset
    ds, wrappers = inner_dataset(ds)
    transform = next((t for x, _ in reversed(layers) if (t := _transform_of(x)) is not None), None)
    settings = transform_settings(transform)
    if isinstance(ds, BatchDataset | StreamBatches):  # one item = one batch, built by ptt.make_loader
        via = "ptt.make_loader"
        batch = getattr(loader.sampler, "batch_size", None) or getattr(ds, "batch_size", None)
        mk = ds.maker
        settings = {"mode": "eval" if mk.resize is not None else "train", "crop": list(mk.crop or []),
                    "scale": list(mk.scale), "ratio": [round(r, 4) for r in mk.ratio], "flip": mk.flip}  # fmt: skip
        ds = getattr(ds, "dataset", None) or getattr(ds, "stream", None)
        transform = None
    return {
        "via": via,
        "class": type(loader).__name__,  # a DataLoader subclass (a trainer's repeating loader) is named
        "dataset": type(ds).__name__ + "".join(f" in {w}" for w in reversed(wrappers)),
        "task": "detection" if type(ds).__name__ in DETECTION_DATASETS else "classification",
        "batch_sampler": sampler,
        "samples": len(ds) if hasattr(ds, "__len__") else None,
        "root": getattr(ds, "root", None),
        "transform": repr(transform).replace("\n", " ") if transform is not None else None,
        "transform_settings": settings,
        "policy": detection_policy(transform) if type(ds).__name__ in DETECTION_DATASETS else None,
        "batch_size": batch,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
    }


def collect(rec: Recorder, report: RunReport) -> RunReport:
    """Fill ``report`` from what ``rec`` saw (steps, loaders, model, optimizer, syncs, sites, peak RSS), then the
    verdict."""
    report.steps = rec.records
    # the loader that fed the most trained steps first: the one whose batches reach the model
    loaders = sorted(rec.loaders.values(), key=lambda x: -rec.step_draws[id(x)])
    report.loaders = [loader_settings(x) for x in loaders]
    for settings, x in zip(report.loaders, loaders, strict=True):
        settings["shm"] = rec.shm.get(id(x))
        ann = rec.annotations.get(id(inner_dataset(x.dataset)[0]))
        if ann is not None:
            settings["annotations"] = ann
    # the optimizer that took the most steps (a throwaway one built and never stepped is not it), and the model
    # whose parameters it updates (not a copy that a profiler or an EMA runs)
    o = max(rec.optimizers.values(), key=lambda x: rec.opt_steps[id(x)], default=None)
    stepped = {id(p) for g in o.param_groups for p in g["params"]} if o is not None else set()
    if rec.models:
        m = max(
            rec.models.values(),
            key=lambda mod: (
                sum(id(p) in stepped for p in mod.parameters()),
                sum(p.numel() for p in mod.parameters()),
            ),
        )
        report.model = {"class": type(m).__name__, "params": sum(p.numel() for p in m.parameters())}
        report.input_shape = rec.shapes.get(id(m), [])
        report.input_list = rec.list_inputs.get(id(m), [])
        if id(m) in rec.outputs:
            report.model["outputs"] = rec.outputs[id(m)]
        task = model_task(m)
        if task:
            report.model["task"] = task
        report.captured["model"] = m
        for kind in ("model", "call"):
            if (kind, id(m)) in rec.sites:
                report.sites[kind] = rec.sites[(kind, id(m))]
    if o is not None:
        report.optimizer = optimizer_settings(o)
        report.captured["optimizer"] = o
        if ("optimizer", id(o)) in rec.sites:
            report.sites["optimizer"] = rec.sites[("optimizer", id(o))]
    if loaders:
        first = loaders[0]
        report.captured["loader"] = first
        ds = first.dataset
        report.captured["dataset"] = getattr(ds, "dataset", ds)  # make_loader's BatchDataset wraps the user's
        for kind in ("loader", "dataset", "sampler"):
            if (kind, id(first)) in rec.sites:
                report.sites[kind] = rec.sites[(kind, id(first))]
    if ("backward", id(None)) in rec.sites:
        report.sites["backward"] = rec.sites[("backward", id(None))]
    rec.stop_meter()
    if rec.cpu is not None and rec.cpu_steps:
        report.cpu = rec.cpu.as_dict()
        report.core_seconds = judge.CoreSeconds.of(rec.cpu, rec.cpu_steps).as_dict()
        report.busy = judge.machine_busy(rec.cpu, torch.get_num_threads())
    n = max(1, len(rec.records))
    report.syncs = sorted(((k, v / n) for k, v in rec.syncs.items()), key=lambda kv: -kv[1])
    try:
        import resource

        report.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        report.peak_rss_bytes = None
    verdict(report)
    return report


_HYPER = ("lr", "momentum", "weight_decay", "nesterov", "foreach", "fused")


def optimizer_settings(opt: Any) -> dict[str, Any]:
    """An optimizer's class, its hyper-parameters as its parameter groups hold them (what it steps with: a
    trainer that passes each group its own lr leaves the constructor's defaults unused) - one value where the
    groups agree, a list of one per group where they differ - and its groups: ``[{params, lr, weight_decay}]``."""
    groups = opt.param_groups
    out: dict[str, Any] = {"class": type(opt).__name__}
    for k in _HYPER:
        vals = [g.get(k) for g in groups]
        if all(isinstance(v, int | float | bool) for v in vals):
            out[k] = vals[0] if all(v == vals[0] for v in vals) else vals
    out["param_groups"] = [
        {"params": sum(1 for _ in g["params"]), **{k: g[k] for k in ("lr", "weight_decay") if k in g}}
        for g in groups
    ]
    return out


def optimizer_text(settings: dict[str, Any]) -> str:
    """``optimizer_settings`` as a person reads it: ``AdamW, lr 0.001429, 3 parameter groups (64 params: lr ...,
    weight_decay 0.0005; ...)``."""

    def num(v: Any) -> str:
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    groups = settings.get("param_groups") or []
    head = [str(settings.get("class", "?"))]
    head += [f"{k}={num(v)}" for k, v in settings.items() if k in _HYPER and not isinstance(v, list)]
    if len(groups) > 1:
        each = [
            f"{g['params']} params: " + ", ".join(f"{k} {num(v)}" for k, v in g.items() if k != "params")
            for g in groups
        ]
        head.append(f"{len(groups)} parameter groups ({'; '.join(each)})")
    return ", ".join(head)


def lint_model(report: RunReport) -> None:
    """``ptt lint`` on the captured model at the run's input shape (a probe of at most 2 samples, the findings
    stated for the real batch); a model lint cannot run on is said in the list, not raised."""
    from pytorchtricks.analysis.lint import lint

    model = report.captured.get("model")
    if model is None or len(report.input_shape) < 2:
        return
    try:
        p = next(model.parameters())
        shape = (min(2, report.input_shape[0]), *report.input_shape[1:])
        with torch.random.fork_rng(devices=[]):  # the caller's RNG stream is left as it was
            probe: Any = torch.randn(shape, device=p.device, dtype=p.dtype)
            if report.input_list:  # a detector: a list of images; linted as it infers (no targets to give)
                probe = ([probe[i].clamp(0, 1) for i in range(len(probe))],)
                with _eval(model):
                    found = lint(model, probe, phase="infer", batch_size=report.input_shape[0]).findings
            else:
                found = lint(model, probe, batch_size=report.input_shape[0]).findings
    except Exception as exc:  # the user's model may not take a random batch of its input's shape: say so
        report.lint = [
            {"id": "-", "name": "lint did not run", "location": "", "message": str(exc)[:300], "fix": ""}
        ]
        return
    report.lint = [
        {"id": f.id, "name": f.name, "location": f.location, "message": f.message, "fix": f.fix}
        for f in found
    ]


@contextlib.contextmanager
def _eval(model: Any) -> Iterator[None]:
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def verdict(r: RunReport) -> None:
    """The verdict, its evidence (the measured split) and the first fix, on ``r``."""
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
    loader = r.loaders[0] if r.loaders else None
    where = r.sites.get("loader")
    at = f" ({os.path.basename(where['file'])}:{where['line']})" if where else ""
    cs = None
    if r.core_seconds:
        cs = judge.CoreSeconds(
            r.core_seconds["main_cpu_s_per_step"],
            r.core_seconds["workers_cpu_s_per_step"],
            r.core_seconds["cores"],
            r.core_seconds["core_s_supplied_per_step"] / max(1, r.core_seconds["cores"]),
        )
        r.evidence += f"; {cs.text()}"
    if r.busy:
        r.evidence += f"; the machine was busy: {r.busy} - the split is the neighbour's as much as the job's"
    v = judge.judge(m["step"], m["data wait"], core_seconds=cs)
    if v.name == judge.INPUT_BOUND:
        r.verdict = v.name
        workers = loader["num_workers"] if loader else "?"
        root = loader.get("root") if loader else None
        via = loader.get("via", "DataLoader") if loader else "DataLoader"
        first = (
            "give the DataLoader workers (num_workers=N) or read through ptt.make_loader (crop-aware scaled decode)"
            if via == "DataLoader"
            else "more workers, or a RAM cache / a pack of the photos at the crop's size"
        )
        r.fix = (
            f"the step waits {share['data wait']:.0%} of its time for its loader{at} ({via}, {workers} workers): "
            + first
            + (f"; `ptt tune --data {root}` measures which, and a RAM cache or a pack" if root else "")
        )
    elif v.name == judge.CPU_CONTENDED:
        r.verdict = v.name
        root = loader.get("root") if loader else None
        r.fix = f"the loader's workers{at} and the training threads share the cores: {v.fix}" + (
            f"; `ptt tune --data {root}` measures which" if root else ""
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
