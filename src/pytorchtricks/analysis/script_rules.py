"""``ptt doctor script FILE``: rules on a training script's syntax tree, and the rewrites that are safe.

Each rule has an id (``PTS001``...), a name, the line:col it found, why it costs and the fix. The script is parsed
with LibCST (the concrete syntax tree TorchFix builds on), never imported or run. ``rewrite`` applies the fixes that
keep the script's results (marked ``fixable``) and keeps its formatting and comments; the others are advice.

"Inside the training loop" means inside a ``for``/``while`` whose body calls ``.backward(...)``.

Example:
    >>> src = "import torch\\nloader = torch.utils.data.DataLoader(ds, batch_size=64)\\n"
    >>> [f.id for f in check_script(src)]
    ['PTS001']
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Any

from pytorchtricks.core import PttError, require

__all__ = ["RULES", "ScriptFinding", "check_script", "rewrite_script"]

# id: (name, why it costs, the fix, fixable)
RULES: dict[str, tuple[str, str, str, bool]] = {
    "PTS001": (
        "dataloader-no-workers",
        "the training process decodes and augments every batch itself: the step waits for it (on the seed's photos "
        "decoding costs more than the step)",
        "DataLoader(..., num_workers=N) with N about the cores you can spare (ptt.autotune_loader measures it)",
        False,
    ),
    "PTS002": (
        "pinned-copy-blocks",
        "pin_memory=True buys an asynchronous host->device copy only with non_blocking=True; without it every copy "
        "waits",
        "x.to(device, non_blocking=True)",
        True,
    ),
    "PTS003": (
        "non-blocking-unpinned",
        "non_blocking=True from pageable (unpinned) memory is a synchronous copy",
        "DataLoader(..., pin_memory=True)",
        False,
    ),
    "PTS004": (
        "host-sync-in-loop",
        "reading a tensor's value on the host (.item(), .cpu(), .numpy(), .tolist()) every step waits for the device "
        "to finish: the GPU idles while Python catches up",
        "accumulate on the device (running = running + loss.detach()) and read it every K steps",
        False,
    ),
    "PTS005": (
        "deprecated-amp",
        "torch.cuda.amp.autocast / GradScaler are deprecated (FutureWarning) in favour of torch.amp",
        'torch.amp.autocast("cuda", ...) / torch.amp.GradScaler("cuda", ...)',
        True,
    ),
    "PTS006": (
        "data-parallel",
        "nn.DataParallel runs one process with a thread per GPU, scatters inputs and gathers outputs on GPU 0 every "
        "step, and is slower than DistributedDataParallel even on one machine",
        "torch.nn.parallel.DistributedDataParallel with torchrun (one process per GPU)",
        False,
    ),
    "PTS007": (
        "unsafe-load",
        "torch.load without weights_only=True unpickles arbitrary objects: a checkpoint can run code",
        "torch.load(path, weights_only=True) (tensors, dicts, numbers load as before)",
        True,
    ),
    "PTS008": (
        "empty-cache-in-loop",
        "torch.cuda.empty_cache() in the loop hands cached blocks back to the driver, and the next step allocates "
        "them again (slow cudaMalloc/cudaFree)",
        "remove it from the loop (call it once after training if another process needs the memory)",
        False,
    ),
    "PTS009": (
        "zero-grad-keeps-tensors",
        "zero_grad(set_to_none=False) writes zeros into every gradient each step and keeps their memory between "
        "steps",
        "zero_grad() (set_to_none=True, the default since torch 2.0; the same update when every parameter gets a "
        "gradient each step)",
        True,
    ),
    "PTS010": (
        "eval-without-no-grad",
        "model.eval() does not stop autograd: the evaluation forward keeps every activation for a backward that "
        "never comes",
        "with torch.inference_mode(): (or torch.no_grad()) around the evaluation loop",
        False,
    ),
    "PTS011": (
        "cudnn-benchmark-deterministic",
        "cudnn.benchmark=True picks the fastest kernel by timing, which cudnn.deterministic=True then forbids: the "
        "two settings fight",
        "keep one: benchmark for speed, or deterministic (ptt.enable_determinism) for bitwise repeatability",
        False,
    ),
    "PTS012": (
        "host-tensor-moved",
        "a tensor created on the host and moved in the loop costs an allocation and a copy every step",
        "create it on the device: torch.zeros(..., device=device)",
        False,
    ),
    "PTS013": (
        "unseeded-workers",
        "the script seeds torch, but DataLoader workers draw their augmentation from seeds the loader derives "
        "itself: runs do not repeat",
        "DataLoader(..., generator=torch.Generator().manual_seed(seed)) (ptt.seed_everything(seed) gives one)",
        False,
    ),
}

_FACTORIES = {
    "tensor",
    "zeros",
    "ones",
    "randn",
    "rand",
    "empty",
    "full",
    "arange",
    "zeros_like",
    "ones_like",
}
_SYNC_ATTRS = {"item", "cpu", "numpy", "tolist"}


@dataclass(frozen=True)
class ScriptFinding:
    """One finding: ``id`` (PTS...), ``name``, position, what was found, why it costs, the fix."""

    id: str
    name: str
    line: int
    col: int
    message: str
    why: str
    fix: str
    fixable: bool

    def __str__(self) -> str:
        tag = "fix" if self.fixable else "advice"
        return f"{self.line}:{self.col} {self.id} {self.name}: {self.message} ({tag}: {self.fix})"


def _cst() -> Any:
    return require("libcst", "script")


def _dotted(node: Any) -> str:
    """``torch.cuda.amp.autocast`` for a Name/Attribute chain, else ``""``."""
    cst = _cst()
    if isinstance(node, cst.Name):
        return str(node.value)
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


def _kwarg(call: Any, name: str) -> Any:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def _is_literal(node: Any, value: str) -> bool:
    cst = _cst()
    return (isinstance(node, cst.Name) and node.value == value) or (
        isinstance(node, cst.Integer) and node.value == value
    )


def _calls_backward(node: Any) -> bool:
    cst = _cst()
    found = False

    class _Find(cst.CSTVisitor):  # type: ignore[misc, name-defined]
        def visit_Call(self, call: Any) -> None:
            nonlocal found
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                found = True

    node.visit(_Find())
    return found


def _parse(source: str) -> Any:
    cst = _cst()
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise PttError(f"the script does not parse: {exc.message} at line {exc.raw_line}") from exc


def check_script(source: str) -> list[ScriptFinding]:
    """Every finding in ``source`` (a script's text), in line order.

    Example:
        >>> [f.name for f in check_script("import torch\\nm = torch.nn.DataParallel(net)\\n")]
        ['data-parallel']
    """
    return _check(source)[0]


def _check(source: str) -> tuple[list[ScriptFinding], set[tuple[str, int, int, int, int]]]:
    """The findings of ``source`` in line order, and the span of each node found (what ``rewrite_script`` edits)."""
    from libcst.metadata import MetadataWrapper

    wrapper = MetadataWrapper(_parse(source))
    v = _visitor_class()(source)
    wrapper.visit(v)
    v.whole_script_rules()
    return sorted(v.found, key=lambda f: (f.line, f.col, f.id)), v.spans


def _visitor_class() -> Any:
    """The LibCST visitor: ``_ScriptRules`` on ``cst.CSTVisitor`` (made here: libcst is the optional ``script``
    extra, imported on first use)."""
    cst = _cst()
    from libcst.metadata import PositionProvider

    class _Visitor(_ScriptRules, cst.CSTVisitor):  # type: ignore[misc, name-defined]
        METADATA_DEPENDENCIES = (PositionProvider,)

    return _Visitor


class _ScriptRules:
    """The rules, as the visit/leave methods of a LibCST visitor (``_visitor_class`` adds the base), and what they
    keep while walking: the enclosing loops, ``if``s and functions, whether a DataLoader pins memory, cudnn flags."""

    get_metadata: Any  # from cst.CSTVisitor (MetadataDependent)

    def __init__(self, source: str) -> None:
        super().__init__()
        self.found: list[ScriptFinding] = []
        self.spans: set[tuple[str, int, int, int, int]] = (
            set()
        )  # (rule, start line, col, end line, col) per node
        self.loops: list[bool] = []  # per enclosing loop: does it call .backward()
        self.if_base: list[int] = []  # the if-depth at each enclosing loop's start
        self.ifs = 0
        self.functions: list[Any] = []
        # pin_memory is a property of the whole script: read it first, so a copy above the DataLoader call is
        # judged too
        self.pinned = "pin_memory=True" in source.replace(" ", "")
        self.seeded = "manual_seed(" in source or "seed_everything(" in source
        self.benchmark: Any = None
        self.deterministic: Any = None

    def add(self, rule: str, node: Any, message: str) -> None:
        from libcst.metadata import PositionProvider

        where = None if hasattr(node, "line") else self.get_metadata(PositionProvider, node)
        pos = node if where is None else where.start
        name, why, fix, fixable = RULES[rule]
        self.found.append(ScriptFinding(rule, name, pos.line, pos.column + 1, message, why, fix, fixable))
        if where is not None:  # the node itself, for the rewrite (a call and its callee start at one place)
            self.spans.add((rule, where.start.line, where.start.column, where.end.line, where.end.column))

    def whole_script_rules(self) -> None:
        """The rules that need the whole script read first (after the walk)."""
        if self.benchmark is not None and self.deterministic is not None:
            self.add("PTS011", self.benchmark, "cudnn.benchmark = True and cudnn.deterministic = True")

    @property
    def in_training_loop(self) -> bool:
        return any(self.loops)

    def _enter_loop(self, node: Any) -> None:
        self.loops.append(_calls_backward(node.body))
        self.if_base.append(self.ifs)

    def _leave_loop(self, node: Any) -> None:
        self.loops.pop()
        self.if_base.pop()

    visit_For = visit_While = _enter_loop
    leave_For = leave_While = _leave_loop

    def visit_If(self, node: Any) -> None:
        self.ifs += 1

    def leave_If(self, node: Any) -> None:
        self.ifs -= 1

    @property
    def every_step(self) -> bool:
        """Inside the training loop and not under an ``if`` in it (a read every K steps is the fix)."""
        return self.in_training_loop and self.ifs == self.if_base[-1]

    def visit_FunctionDef(self, node: Any) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, node: Any) -> None:
        self.functions.pop()

    def visit_Assign(self, node: Any) -> None:
        from libcst.metadata import PositionProvider

        target = _dotted(node.targets[0].target) if node.targets else ""
        if target.endswith("cudnn.benchmark") and _is_literal(node.value, "True"):
            self.benchmark = self.get_metadata(PositionProvider, node).start
        if target.endswith("cudnn.deterministic") and _is_literal(node.value, "True"):
            self.deterministic = node

    def visit_Call(self, node: Any) -> None:
        cst = _cst()
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1] if name else ""
        attr = node.func.attr.value if isinstance(node.func, cst.Attribute) else ""
        if last == "DataLoader":
            self._dataloader(node)
        elif name.startswith("torch.cuda.amp.") and last in ("autocast", "GradScaler"):
            self.add("PTS005", node, f"{name}(...)")
        elif last == "DataParallel":
            self.add("PTS006", node, f"{name}(...)")
        elif name == "torch.load":
            wo = _kwarg(node, "weights_only")
            if wo is None or _is_literal(wo.value, "False"):
                self.add("PTS007", node, "torch.load(...) without weights_only=True")
        elif name == "torch.cuda.empty_cache" and self.loops:
            self.add("PTS008", node, "torch.cuda.empty_cache() inside a loop")
        elif attr == "zero_grad":
            stn = _kwarg(node, "set_to_none")
            if stn is not None and _is_literal(stn.value, "False"):
                self.add("PTS009", node, "zero_grad(set_to_none=False)")
        elif attr == "eval" and not node.args and self.functions and not self._under_no_grad():
            self.add(
                "PTS010",
                node,
                f"{_dotted(node.func) or '.eval'}() in a function with no no_grad/inference_mode",
            )
        if attr in _SYNC_ATTRS and not node.args and self.every_step:
            self.add("PTS004", node, f".{attr}() inside the training loop")
        if attr in ("to", "cuda") and self.loops:
            self._device_copy(node, attr)

    def _device_copy(self, node: Any, attr: str) -> None:
        """``x.to(...)`` / ``x.cuda(...)`` inside a loop: a tensor made on the host each step, or a copy whose
        ``non_blocking`` does not match whether the batches are pinned."""
        cst = _cst()
        inner = node.func.value
        factory = _dotted(inner.func) if isinstance(inner, cst.Call) else ""
        nb = _kwarg(node, "non_blocking")
        if factory.startswith("torch.") and factory.rsplit(".", 1)[-1] in _FACTORIES:
            self.add("PTS012", node, f"{factory}(...).{attr}(...) inside a loop")
        elif nb is not None and _is_literal(nb.value, "True") and not self.pinned:
            self.add("PTS003", node, f".{attr}(..., non_blocking=True) while no DataLoader pins memory")
        elif nb is None and self.pinned and self.in_training_loop:
            self.add("PTS002", node, f".{attr}(...) of a pinned batch without non_blocking=True")

    def _dataloader(self, node: Any) -> None:
        nw = _kwarg(node, "num_workers")
        pin = _kwarg(node, "pin_memory")
        if pin is not None and _is_literal(pin.value, "True"):
            self.pinned = True
        if nw is None or _is_literal(nw.value, "0"):
            self.add(
                "PTS001",
                node,
                "DataLoader(...) " + ("without num_workers" if nw is None else "num_workers=0"),
            )
        elif self.seeded and _kwarg(node, "worker_init_fn") is None and _kwarg(node, "generator") is None:
            self.add("PTS013", node, "DataLoader(num_workers=...) without generator= or worker_init_fn=")

    def _under_no_grad(self) -> bool:
        text = _cst().Module(body=[self.functions[-1]]).code
        return "no_grad" in text or "inference_mode" in text


def rewrite_script(source: str) -> str:
    """``source`` with the fixable findings rewritten (formatting and comments kept): ``non_blocking=True`` on the
    loop's copies of pinned batches, ``torch.amp`` for ``torch.cuda.amp``, ``weights_only=True`` for ``torch.load``,
    ``zero_grad()`` for ``zero_grad(set_to_none=False)``.

    Example:
        >>> print(rewrite_script("s = torch.cuda.amp.GradScaler(enabled=False)\\n"), end="")
        s = torch.amp.GradScaler("cuda", enabled=False)
    """
    cst = _cst()
    fix_spans = {sp for sp in _check(source)[1] if RULES[sp[0]][3]}
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(_parse(source))

    class _Fix(cst.CSTTransformer):  # type: ignore[misc, name-defined]
        METADATA_DEPENDENCIES = (PositionProvider,)

        def _marked(self, rule: str, node: Any) -> bool:
            r = self.get_metadata(PositionProvider, node)
            return (rule, r.start.line, r.start.column, r.end.line, r.end.column) in fix_spans

        def leave_Call(self, original: Any, updated: Any) -> Any:
            if self._marked("PTS005", original):
                last = _dotted(updated.func).rsplit(".", 1)[-1]
                func = cst.parse_expression(f"torch.amp.{last}")
                device = cst.Arg(value=cst.SimpleString('"cuda"'))
                return updated.with_changes(func=func, args=[device, *updated.args])
            if self._marked("PTS007", original):
                args = [a for a in updated.args if not (a.keyword and a.keyword.value == "weights_only")]
                return updated.with_changes(args=_append(args, _kw("weights_only", "True")))
            if self._marked("PTS009", original):
                args = [a for a in updated.args if not (a.keyword and a.keyword.value == "set_to_none")]
                return updated.with_changes(args=args)
            if self._marked("PTS002", original):
                return updated.with_changes(args=_append(list(updated.args), _kw("non_blocking", "True")))
            return updated

    def _append(args: list[Any], arg: Any) -> list[Any]:
        """``args`` + ``arg``, the space before the closing parenthesis kept after the new last argument."""
        if not args:
            return [arg]
        last = args[-1]
        tail = last.whitespace_after_arg
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        prev = last.with_changes(comma=comma, whitespace_after_arg=cst.SimpleWhitespace(""))
        return [*args[:-1], prev, arg.with_changes(whitespace_after_arg=tail)]

    def _kw(name: str, value: str) -> Any:
        return cst.Arg(
            keyword=cst.Name(name),
            value=cst.Name(value),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
            ),
        )

    return str(wrapper.visit(_Fix()).code)


def read_script(path: str) -> str:
    if not os.path.isfile(path):
        raise PttError(f"{path}: no such file; give the training script's path (ptt doctor script train.py).")
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def unified_diff(before: str, after: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(True), after.splitlines(True), f"{path} (before)", f"{path} (--fix)"
        )
    )


def write_fixed(path: str, fixed: str) -> str:
    """Write the rewritten script atomically; the original is kept once as ``PATH.orig`` (never overwritten).
    Returns the backup's path."""
    backup = path + ".orig"
    if not os.path.exists(backup):
        with open(path, "rb") as src, open(backup + ".tmp", "wb") as dst:
            dst.write(src.read())
        os.replace(backup + ".tmp", backup)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(fixed)
    os.replace(tmp, path)
    return backup
