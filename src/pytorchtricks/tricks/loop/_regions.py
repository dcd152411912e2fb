"""Measure a model's candidate checkpoint regions on a real batch, and apply a region plan.

The probe is one training forward of the user's model on the user's batch (after a warm one), with:
- a hook before and after every module: the module stack, calls per module, each module's input storages and
  whether its forward modified an input in place (a checkpoint would then recompute from a changed input);
- ``saved_tensors_hooks``: which storage autograd keeps for backward, saved by which module stack;
- a ``TorchDispatchMode``: the seconds of every aten op (``clock.now_s``), added to each module on the stack, and
  the outputs of the ops a selective checkpoint saves (convolutions, matmuls, attention).
From these: what each region frees when checkpointed fully or selectively, what its recomputation brings back,
and what the recomputation costs. Runs of siblings come from ``torch.fx`` traces of each parent's own forward
(children as leaves); a parent that does not trace offers no runs, its children stay candidates.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

from pytorchtricks.clock import now_s, sync
from pytorchtricks.tricks.loop._region_planner import Option, Region, Tree

Key = tuple[int, int]  # (storage data_ptr, nbytes)


def _key(t: torch.Tensor) -> Key:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _save_ops() -> set[Any]:
    """The ops a selective checkpoint keeps (their outputs are expensive to recompute, cheap ops are not)."""
    aten = torch.ops.aten
    names = (
        "convolution", "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention", "_efficient_attention_forward", "_flash_attention_forward",
    )  # fmt: skip
    return {getattr(aten, n) for n in names if hasattr(aten, n)}


@contextlib.contextmanager
def no_stat_update(modules: Sequence[nn.Module]) -> Iterator[None]:
    """During recomputation: BN in train mode normalises with batch statistics exactly as in the forward, but its
    running statistics and ``num_batches_tracked`` updates land in throw-away copies (so they happen once).

    Copies, not ``running_mean=None``: autograd must save the same tensors as in the original forward.
    """
    names = ("running_mean", "running_var", "num_batches_tracked")
    bns = [m for blk in modules for m in blk.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    swapped = []
    for m in bns:
        if m.training and m.track_running_stats:
            originals = {n: getattr(m, n) for n in names}
            for n, t in originals.items():
                if t is not None:
                    setattr(m, n, t.clone())
            swapped.append((m, originals))
    try:
        yield
    finally:
        for m, originals in swapped:
            for n, t in originals.items():
                setattr(m, n, t)


@contextlib.contextmanager
def side_effect_free(module: nn.Module, x: torch.Tensor) -> Iterator[None]:
    """Restore the RNG and every buffer (BN statistics) after a planning pass."""
    buffers = {k: v.clone() for k, v in module.state_dict(keep_vars=True).items() if not v.requires_grad}
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for k, v in module.state_dict(keep_vars=True).items():
                    if k in buffers:
                        v.copy_(buffers[k])


# ----------------------------------------------------------------------------------------------- the probe


class _Record:
    def __init__(self, model: nn.Module, args: tuple[Any, ...]) -> None:
        self.stack: list[str] = []
        self.calls: dict[str, int] = defaultdict(int)
        self.inputs: dict[str, set[Key]] = defaultdict(set)
        self.inplace: set[str] = set()
        self.grad_in: set[str] = set()  # modules called with an input that requires grad
        self.out_bytes: dict[str, int] = defaultdict(int)  # bytes of each module's outputs (its last call)
        self.time_s: dict[str, float] = defaultdict(float)
        self.cheap_s: dict[str, float] = defaultdict(float)
        self.total_s = 0.0
        self.saveouts: dict[Key, set[str]] = defaultdict(set)  # outputs of save ops -> modules on the stack
        self.savers: dict[Key, list[frozenset[str]]] = defaultdict(list)
        self.nbytes: dict[Key, int] = {}
        live = [*model.parameters(), *model.buffers(), *_tensors(args)]
        self.live = {_key(t) for t in live}
        self.device = next((t.device for t in live), torch.device("cpu"))


class _OpTimer(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, rec: _Record, save_ops: set[Any]) -> None:
        super().__init__()
        self.rec, self.save_ops = rec, save_ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        rec = self.rec
        sync(rec.device)
        t0 = now_s()
        out = func(*args, **(kwargs or {}))
        sync(rec.device)
        dt = now_s() - t0
        save = func.overloadpacket in self.save_ops
        rec.total_s += dt
        for p in rec.stack:
            rec.time_s[p] += dt
            if not save:
                rec.cheap_s[p] += dt
        if save:
            for t in _tensors(out):
                rec.saveouts[_key(t)].update(rec.stack)
        return out


def probe(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Record:
    """One measured training forward of ``model`` (the caller undoes its side effects)."""
    rec = _Record(model, args)
    paths = {id(m): p for p, m in model.named_modules()}
    handles = []

    def pre(m: nn.Module, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
        p = paths[id(m)]
        rec.stack.append(p)
        rec.calls[p] += 1
        ts = _tensors((a, kw))
        rec.inputs[p].update(_key(t) for t in ts)
        if any(t.requires_grad for t in ts):
            rec.grad_in.add(p)
        m._ptt_versions = [(t, t._version) for t in ts]  # type: ignore[assignment]

    def post(m: nn.Module, a: tuple[Any, ...], kw: dict[str, Any], out: Any) -> None:
        p = rec.stack.pop()
        rec.out_bytes[p] = sum(t.untyped_storage().nbytes() for t in _tensors(out))
        if any(t._version != v for t, v in m.__dict__.pop("_ptt_versions", [])):
            rec.inplace.add(p)

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        k = _key(t)
        if not (base.is_leaf and base.requires_grad) and k not in rec.live:
            rec.savers[k].append(frozenset(rec.stack))
            rec.nbytes[k] = k[1]
        return t

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _OpTimer(rec, _save_ops()):
            out = model(*args, **kwargs)
        del out
    finally:
        for h in handles:
            h.remove()
    return rec


# ----------------------------------------------------------------------------------------------- regions


def _costs(
    rec: _Record, members: tuple[str, ...], inputs: set[Key], conv_out: int | None = None
) -> list[Option]:
    """The region's options with their costs. ``conv_out``: the region is a channel-split chain
    (``channel_chain``) whose convolution outputs these bytes; that adds the ``channels`` option where the
    region's input needs no gradient."""
    inside = set(members)
    saved_in = [k for k, st in rec.savers.items() if any(s & inside for s in st) and k not in inputs]
    only_in = {k for k in saved_in if all(s & inside for s in rec.savers[k])}
    outs = {k for k, ps in rec.saveouts.items() if ps & inside}
    # a checkpoint keeps its inputs: bytes nobody kept before are new (the forward's own inputs are live anyway)
    added = sum(k[1] for k in inputs if k not in rec.savers and k not in rec.live)
    secs = sum(rec.time_s[m] for m in members)
    cheap = sum(rec.cheap_s[m] for m in members)
    full = Option("full", sum(k[1] for k in only_in) - added, sum(k[1] for k in saved_in), secs)
    options = [full]
    if conv_out is not None and members[0] not in rec.grad_in:
        # the convolution's output comes back whole (it becomes its own gradient's buffer); the rest of what the
        # region saved comes back one channel slice at a time, with its gradient
        rest = max(0, sum(k[1] for k in saved_in) - conv_out)
        options.append(Option("channels", full.freed_bytes, conv_out + 2 * rest // CHANNEL_CHUNKS, secs))
    if not outs & set(saved_in):
        return options  # nothing to keep: selective is full
    kept_outs = sum(k[1] for k in outs if k not in rec.savers and k not in rec.live)
    sel = Option(
        "selective",
        sum(k[1] for k in only_in if k not in outs) - added - kept_outs,
        sum(k[1] for k in saved_in if k not in outs),
        cheap,
    )
    return [*options, sel]


def _reason(rec: _Record, members: tuple[str, ...]) -> str:
    for m in members:
        if rec.calls.get(m, 0) == 0:
            return "not called in a training forward"
    if members[0] in rec.inplace:  # later members of a run get the previous member's output, made inside
        return "modifies its input in place (a recomputation would start from the changed input)"
    return ""


def _trace_children(parent: nn.Module) -> Any:
    """``torch.fx`` graph of ``parent``'s own forward, its children left as calls."""
    import torch.fx as fx

    kids = {id(c) for c in parent.children()}

    class _Tracer(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return id(m) in kids or super().is_leaf_module(m, qualname)

    return _Tracer().trace(parent)


def _chains(parent: nn.Module, path: str, rec: _Record) -> list[list[str]]:
    """Maximal chains of children of ``parent`` in its traced forward: each called once, each output used only
    as the next child's only input."""
    if len(list(parent.children())) < 2:
        return []
    try:
        graph = _trace_children(parent)
    except Exception:  # data-dependent control flow, unsupported ops: no runs for this parent
        return []
    prefix = f"{path}." if path else ""
    mods = [n for n in graph.nodes if n.op == "call_module" and "." not in str(n.target)]
    targets = [str(n.target) for n in mods]
    once = {t for t in targets if targets.count(t) == 1 and rec.calls.get(prefix + t, 0) == 1}
    nxt: dict[Any, Any] = {}
    for n in mods:
        users = list(n.users)
        if str(n.target) in once and len(users) == 1:
            u = users[0]
            if u.op == "call_module" and str(u.target) in once and u.args == (n,) and not u.kwargs:
                nxt[n] = u
    heads = [n for n in nxt if n not in set(nxt.values())]
    out = []
    for h in heads:
        chain = [h]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        out.append([prefix + str(n.target) for n in chain])
    return out


MAX_RUN = 16  # longest run of siblings offered as one region


def build_tree(model: nn.Module, rec: _Record) -> Tree:
    """Candidate regions of ``model`` with their measured costs."""
    children: dict[str, list[str]] = {}
    chains: dict[str, list[list[str]]] = {}
    regions: dict[str, Region] = {}
    runs: dict[tuple[str, ...], Region] = {}
    paths = {id(mod): p for p, mod in model.named_modules()}

    def conv_out(mods: list[nn.Module]) -> int | None:
        chain = channel_chain(mods)
        return None if chain is None else rec.out_bytes.get(paths[id(chain[0])], 0)

    for path, m in model.named_modules():
        prefix = f"{path}." if path else ""
        children[path] = [prefix + n for n, _ in m.named_children()]
        name = path or "<model>"
        saved = sum(k[1] for k, st in rec.savers.items() if any(path in s for s in st))
        region = Region(name, None, (path,), saved_bytes=saved, reason=_reason(rec, (path,)))
        if not region.reason:
            region.options = _costs(rec, (path,), rec.inputs[path], conv_out([m]))
        regions[name] = region
        if children[path] and rec.calls.get(path, 0) > 0:
            chains[path] = [c for c in _chains(m, path, rec) if len(c) >= 2]
            for chain in chains[path]:
                for i in range(len(chain)):
                    for j in range(i + 2, min(len(chain), i + MAX_RUN) + 1):
                        members = tuple(chain[i:j])
                        run = Region(f"{members[0]}..{members[-1].rsplit('.', 1)[-1]}", path, members)
                        run.reason = _reason(rec, members)
                        if not run.reason:
                            mods = [model.get_submodule(x) for x in members]
                            run.options = _costs(rec, members, rec.inputs[members[0]], conv_out(mods))
                        runs[members] = run
    for region in regions.values():
        nested = _nested_option(region, chains.get(region.members[0], []), runs, children)
        if nested is not None:
            region.options.append(nested)
    return Tree(children, chains, regions, runs)


def _nested_option(
    region: Region,
    chains: list[list[str]],
    runs: dict[tuple[str, ...], Region],
    children: dict[str, list[str]],
) -> Option | None:
    """A module's ``nested`` option: its full checkpoint, with each chain of its children that is not all of them
    checkpointed again inside the recomputation (a residual block's convolution -> BatchNorm pairs). Backward then
    holds the block's recomputed activations less what those runs keep, plus one run's own at a time; the runs
    are computed twice in all."""
    full = next((o for o in region.options if o.mode == "full"), None)
    if full is None or region.reason:
        return None
    inner = []
    for chain in chains:
        run = runs.get(tuple(chain))
        if run is None or run.reason or len(chain) == len(children.get(region.members[0], [])):
            continue
        opt = next((o for o in run.options if o.mode == "full" and o.freed_bytes > 0), None)
        if opt is not None:
            inner.append((run.members, opt))
    if not inner:
        return None
    kept = full.transient_bytes - sum(o.freed_bytes for _, o in inner)
    transient = max(0, kept) + max(o.transient_bytes for _, o in inner)
    if transient >= full.transient_bytes:
        return None
    secs = full.recompute_s + sum(o.recompute_s for _, o in inner)
    return Option("nested", full.freed_bytes, transient, secs, tuple(m for m, _ in inner))


# ------------------------------------------------------------------------------------- the channel split

CHANNEL_CHUNKS = 8  # channel slices a ``channels`` region's backward walks through

# Modules that act on each channel alone, hold no parameter and no randomness, and give the same bits on a slice
# as on the whole: comparisons, one multiply, a window's max or sum. Activations built on exp/erf/division (SiLU,
# GELU, Sigmoid, Hardswish, ...) are left out: their vectorised and scalar loops may round differently, and a
# slice puts elements on the other loop than the whole tensor did (SiLU and ELU measured 1 ulp apart).
_CHANNEL_LOCAL = (
    nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.LeakyReLU, nn.Identity, nn.MaxPool2d, nn.AvgPool2d,
)  # fmt: skip


def _is_frozen_bn(m: nn.Module) -> bool:
    return type(m).__name__ == "FrozenBatchNorm2d" and all(
        isinstance(getattr(m, n, None), torch.Tensor)
        for n in ("weight", "bias", "running_mean", "running_var")
    )


def channel_chain(modules: Sequence[nn.Module]) -> list[nn.Module] | None:
    """``modules`` (a run of siblings, or one ``nn.Sequential``, flattened) as a chain that a ``channels``
    checkpoint can run: a 2-D convolution (groups 1), then only per-channel modules - BatchNorm2d, torchvision's
    FrozenBatchNorm2d, parameterless activations and pooling. None when it is not one."""
    flat: list[nn.Module] = []
    stack = list(reversed(modules))
    while stack:
        m = stack.pop()
        if type(m) is nn.Sequential:
            stack.extend(reversed(list(m.children())))
        else:
            flat.append(m)
    if len(flat) < 2 or type(flat[0]) is not nn.Conv2d:
        return None
    conv = flat[0]
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return None
    for m in flat[1:]:
        if isinstance(m, nn.BatchNorm2d) or _is_frozen_bn(m) or type(m) in _CHANNEL_LOCAL:
            continue
        return None
    return flat


def _slice_forward(m: nn.Module, x: torch.Tensor, sl: slice, leaves: dict[int, torch.Tensor]) -> torch.Tensor:
    """Module ``m`` on channel slice ``sl`` of its input; a BatchNorm's affine parameters sliced as fresh leaves
    (in ``leaves``, by the parameter's id) whose gradients the caller collects."""
    import torch.nn.functional as F

    if isinstance(m, nn.BatchNorm2d):
        w = b = None
        if m.weight is not None:
            w = leaves[id(m.weight)] = m.weight.detach()[sl].requires_grad_(m.weight.requires_grad)
        if m.bias is not None:
            b = leaves[id(m.bias)] = m.bias.detach()[sl].requires_grad_(m.bias.requires_grad)
        batch_stats = m.training or m.running_mean is None
        rm = None if batch_stats or m.running_mean is None else m.running_mean[sl]
        rv = None if batch_stats or m.running_var is None else m.running_var[sl]
        return F.batch_norm(x, rm, rv, w, b, batch_stats, 0.0, m.eps)  # statistics were updated in forward
    if _is_frozen_bn(m):  # torchvision's formula, on the slice of its buffers

        def part(name: str) -> torch.Tensor:
            t: torch.Tensor = getattr(m, name)
            return t[sl].reshape(1, -1, 1, 1)

        scale = part("weight") * (part("running_var") + cast(float, m.eps)).rsqrt()
        return x * scale + (part("bias") - part("running_mean") * scale)
    out: torch.Tensor = m(x)
    return out


def _channel_slices(channels: int) -> list[slice]:
    step = -(-channels // CHANNEL_CHUNKS)
    return [slice(c0, min(channels, c0 + step)) for c0 in range(0, channels, step)]


def _bn_step(m: nn.BatchNorm2d) -> tuple[float, bool]:
    """What ``_BatchNorm.forward`` does before normalising, once per forward: ``num_batches_tracked`` counted,
    the running statistics' update factor, and whether batch statistics normalise."""
    factor = 0.0 if m.momentum is None else m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
    return factor, m.training or (m.running_mean is None and m.running_var is None)


def _bn_slice(m: nn.BatchNorm2d, x: torch.Tensor, sl: slice, step: tuple[float, bool]) -> torch.Tensor:
    """``_BatchNorm.forward`` on channel slice ``sl``: its running statistics' slice updated in place."""
    import torch.nn.functional as F

    factor, batch_stats = step
    keep = not m.training or m.track_running_stats
    return F.batch_norm(
        x,
        m.running_mean[sl] if keep and m.running_mean is not None else None,
        m.running_var[sl] if keep and m.running_var is not None else None,
        None if m.weight is None else m.weight[sl],
        None if m.bias is None else m.bias[sl],
        batch_stats,
        factor,
        m.eps,
    )


def _chain_params(chain: list[nn.Module]) -> list[torch.Tensor]:
    """The parameters autograd routes the per-channel modules' gradients to: the BatchNorms' affine ones."""
    return [
        p for m in chain[1:] if isinstance(m, nn.BatchNorm2d) for p in (m.weight, m.bias) if p is not None
    ]


def _autocast_now(device_type: str) -> list[tuple[str, torch.dtype]]:
    """The autocast regions in force (device type, dtype), to recompute under the same ones."""
    return [
        (d, torch.get_autocast_dtype(d))
        for d in dict.fromkeys((device_type, "cpu"))
        if torch.is_autocast_enabled(d)
    ]


class _ChannelConv(torch.autograd.Function):
    """The convolution of a ``channels`` region, keeping only its input (the image) and weight: its backward is
    the untreated convolution's weight and bias gradient (``aten.convolution_backward``, what autograd runs for
    ``F.conv2d``) from the output gradient ``_ChannelSplit`` hands it. A node of its own so that autograd has let
    go of the region's incoming gradient before this backward's buffers (oneDNN's reordered copy of the output
    gradient) are allocated."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, conv: nn.Conv2d, w: torch.Tensor, b: torch.Tensor | None) -> Any:
        import torch.nn.functional as F

        ctx.conv, ctx.has_bias = conv, b is not None
        ctx.save_for_backward(x, w)
        return F.conv2d(x, w, b, *_conv_args(conv))

    @staticmethod
    def backward(ctx: Any, gz: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        conv: nn.Conv2d = ctx.conv
        need_w, need_b = ctx.needs_input_grad[2], ctx.has_bias and ctx.needs_input_grad[3]
        if not (need_w or need_b):
            return None, None, None, None
        # autocast ran the forward's convolution in gz's dtype: its inputs cast as autocast casts them
        dt = gz.dtype
        _, gw, gb = torch.ops.aten.convolution_backward(
            gz, x.to(dt), w.to(dt), [w.shape[0]] if ctx.has_bias else None, list(conv.stride),
            list(cast(tuple[int, ...], conv.padding)), list(conv.dilation), False, [0] * len(conv.stride),
            conv.groups, [False, need_w, need_b],
        )  # fmt: skip
        return (
            None,
            None,
            gw.to(w.dtype) if need_w else None,
            gb.to(w.dtype) if need_b else None,  # autocast's cast of the bias back, as of the weight
        )


def _conv_args(conv: nn.Conv2d) -> tuple[Any, ...]:
    """``F.conv2d``'s stride, padding, dilation, groups (channel_chain refuses string padding)."""
    return conv.stride, cast(tuple[int, ...], conv.padding), conv.dilation, conv.groups


def _part_rows(n: int) -> int:
    return max(2, -(-n // CHANNEL_CHUNKS))  # batch rows per part (one sample alone can take another kernel)


_PARTS_EXACT: dict[tuple[Any, ...], bool] = {}  # per problem: parts of the batch give the whole's bits


def parts_exact(z: torch.Tensor, x: torch.Tensor, conv: nn.Conv2d) -> bool:
    """Whether the convolution of ``x`` computed ``_part_rows`` samples at a time equals ``z`` (its output on the
    whole batch) bit for bit: checked once per problem (shapes, dtypes, device, convolution), part by part, on
    the forward's own values. A convolution computes each sample's output from that sample alone, but the
    library picks its kernel by the whole problem, batch size included (one sample alone measured 1 ulp off),
    so the check is a measurement, not an assumption."""
    import torch.nn.functional as F

    key = (tuple(x.shape), x.dtype, z.dtype, x.device, tuple(conv.weight.shape), _conv_args(conv))
    if key not in _PARTS_EXACT:
        step = _part_rows(x.shape[0])
        with torch.no_grad():
            _PARTS_EXACT[key] = step < x.shape[0] and all(
                torch.equal(
                    F.conv2d(x[i : i + step], conv.weight, conv.bias, *_conv_args(conv)), z[i : i + step]
                )
                for i in range(0, x.shape[0], step)
            )
    return _PARTS_EXACT[key]


def _conv_again(x: torch.Tensor, conv: nn.Conv2d, in_parts: bool) -> torch.Tensor:
    """The forward's convolution output again; ``in_parts``: a few samples at a time into one buffer, so the
    library's own workspace (oneDNN's blocked-layout output, as large as the output) is a part's, not the batch's."""
    import torch.nn.functional as F

    if not in_parts:
        return F.conv2d(x, conv.weight, conv.bias, *_conv_args(conv))
    step = _part_rows(x.shape[0])
    z: torch.Tensor | None = None
    for i in range(0, x.shape[0], step):
        part = F.conv2d(x[i : i + step], conv.weight, conv.bias, *_conv_args(conv))
        if z is None:
            z = part.new_empty((x.shape[0], *part.shape[1:]))
        z[i : i + step] = part
        del part
    assert z is not None
    return z


class _ChannelSplit(torch.autograd.Function):
    """The per-channel modules after a ``_ChannelConv`` (a convolution whose input needs no gradient: an image),
    checkpointed so that their backward never holds the region's activations whole.

    Forward runs them one channel slice of the convolution's output at a time (BatchNorm's running statistics
    updated once, slice by slice) and keeps only the convolution's input. Backward recomputes the convolution's
    output (under the forward's autocast, if any; a few samples at a time where ``parts_exact`` measured that
    to give the same bits, so the library's workspace is a part's), then walks its channels in ``CHANNEL_CHUNKS`` slices:
    each slice through the per-channel modules again and back, its gradient written over the slice of the
    convolution's output it came from; that buffer is the gradient handed to ``_ChannelConv``. Per channel every
    op is the untreated one on the same values, so outputs and gradients are the untreated step's bit for bit
    (tests compare them); what comes back at once is the convolution's output plus one slice of the rest, not all
    of it (the ResNet stem alone at batch 8, 96 px: 4.8 MB instead of 9.4 MB)."""

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, x: torch.Tensor, chain: list[nn.Module], *params: torch.Tensor
    ) -> Any:
        ctx.chain = chain
        ctx.autocast = _autocast_now(x.device.type)
        ctx.in_parts = parts_exact(z, x, cast(nn.Conv2d, chain[0]))
        ctx.save_for_backward(x)
        steps = {id(m): _bn_step(m) for m in chain[1:] if isinstance(m, nn.BatchNorm2d)}  # counted once
        out: torch.Tensor | None = None
        for sl in _channel_slices(z.shape[1]):  # forward too holds one slice of the rest at a time
            part = z[:, sl].contiguous()
            for m in chain[1:]:
                part = (
                    _bn_slice(cast(nn.BatchNorm2d, m), part, sl, steps[id(m)])
                    if id(m) in steps
                    else _slice_forward(m, part, sl, {})
                )
            if out is None:
                out = part.new_empty((part.shape[0], z.shape[1], *part.shape[2:]))
            out[:, sl] = part
        assert out is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        chain: list[nn.Module] = ctx.chain
        conv, tail = cast(nn.Conv2d, chain[0]), chain[1:]
        params = _chain_params(chain)
        grads: dict[int, torch.Tensor] = {}  # by parameter id, filled slice by slice
        with contextlib.ExitStack() as amp:
            for device_type, dtype in ctx.autocast:
                amp.enter_context(torch.autocast(device_type, dtype=dtype))
            with torch.no_grad():  # the forward's convolution again: the same values
                z = _conv_again(x, conv, ctx.in_parts)
            for sl in _channel_slices(z.shape[1]):
                leaves: dict[int, torch.Tensor] = {}
                with torch.enable_grad():
                    zc = z[:, sl].contiguous().requires_grad_()
                    out = zc
                    for m in tail:
                        out = _slice_forward(m, out, sl, leaves)
                    pids = [k for k, t in leaves.items() if t.requires_grad]
                    got = torch.autograd.grad(out, [zc, *(leaves[k] for k in pids)], grad[:, sl].contiguous())
                del out
                for pid, g in zip(pids, got[1:]):
                    if pid not in grads:
                        shape = next(p for p in params if id(p) == pid).shape
                        grads[pid] = torch.zeros(shape, dtype=g.dtype, device=g.device)
                    grads[pid][sl] = g
                z[:, sl] = got[0]  # this slice of z is spent: it holds the slice's gradient from now on
                del zc, got, leaves
        return (z, None, None, *[grads.get(id(p)) for p in params])


def _channel_split(modules: Sequence[nn.Module], fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The ``channels`` mode where it applies (one tensor input that needs no gradient); else a full checkpoint."""
    chain = channel_chain(modules)
    x = args[0] if len(args) == 1 and not kwargs else None
    # channels_last: BatchNorm's kernel sums a channel across vector lanes laid out by the channel count, so a
    # slice of channels would sum in another order (measured: the weight gradient off by an ulp)
    if chain is not None and isinstance(x, torch.Tensor) and not x.requires_grad and x.is_contiguous():
        conv = cast(nn.Conv2d, chain[0])
        z = _ChannelConv.apply(x, conv, conv.weight, conv.bias)
        return _ChannelSplit.apply(z, x, chain, *_chain_params(chain))
    return run_checkpointed(fn, "full", modules, *args, **kwargs)


# ----------------------------------------------------------------------------------------------- applying


def _policy(save_ops: set[Any]) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op in save_ops or getattr(op, "overloadpacket", None) in save_ops:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


@contextlib.contextmanager
def _together(*ctxs: Any) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for c in ctxs:
            stack.enter_context(c)
        yield


def _contexts(mode: str, modules: Sequence[nn.Module]) -> tuple[Any, Any]:
    """(forward, recomputation) contexts of a region: BN statistics updated once; selective: the SAC policy."""
    if mode == "full":
        return contextlib.nullcontext(), no_stat_update(modules)
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    fwd, rec = create_selective_checkpoint_contexts(_policy(_save_ops()))
    return fwd, _together(no_stat_update(modules), rec)  # the stat copies are made outside the SAC mode


@functools.cache
def _sac_hooks_kwarg() -> dict[str, Any]:
    """Tensors a selective checkpoint keeps go through an outer ``saved_tensors_hooks`` (``save_on_cpu``, a meter)
    like any saved tensor, where this torch lets us say so (newer ones warn until told)."""
    import inspect

    ok = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters
    return {"respect_saved_tensors_hooks": True} if ok else {}


def run_checkpointed(fn: Any, mode: str, modules: Sequence[nn.Module], *args: Any, **kwargs: Any) -> Any:
    if mode == "channels":
        return _channel_split(modules, fn, *args, **kwargs)
    extra: dict[str, Any] = _sac_hooks_kwarg() if mode == "selective" else {}
    return checkpoint(
        fn,
        *args,
        use_reentrant=False,
        preserve_rng_state=True,
        context_fn=functools.partial(_contexts, mode, modules),
        **extra,
        **kwargs,
    )  # type: ignore[call-overload]


def _module_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    fwd, mode = self.__dict__["_ptt_region"]
    if not torch.is_grad_enabled():
        return fwd(*args, **kwargs)
    return run_checkpointed(fwd, mode, [self], *args, **kwargs)


class _Run(nn.Module):
    """A run of siblings as one callable; not registered in the model (its modules are the model's own)."""

    def __init__(self, modules: list[nn.Module], mode: str) -> None:
        super().__init__()
        self.__dict__["_members"] = modules  # plain attribute: no second parent in the module tree
        self.mode = mode

    def _run(self, *args: Any) -> Any:
        mods = self.__dict__["_members"]
        x = mods[0](*args)
        for m in mods[1:]:
            x = m(x)
        return x

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._run(*args)
        return run_checkpointed(self._run, self.mode, self.__dict__["_members"], *args)


def _traced_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    gm, original, training = self.__dict__["_ptt_traced"]
    if torch.is_grad_enabled() and self.training == training:
        return gm(*args, **kwargs)
    return original(*args, **kwargs)


def apply(model: nn.Module, plan: list[tuple[tuple[str, ...], str]]) -> None:
    """Checkpoint each ``(members, mode)`` of ``plan`` in place: a run of siblings is cut out of its parent's
    traced forward and called as one checkpoint; a module's forward is wrapped - after its runs, so a module
    whose runs are in the plan too is checkpointed around them (``nested``: they checkpoint again inside its
    recomputation)."""
    import torch.fx as fx

    by_parent: dict[str, list[tuple[tuple[str, ...], str]]] = defaultdict(list)
    for members, mode in plan:
        if len(members) > 1:
            by_parent[members[0].rpartition(".")[0]].append((members, mode))
    for path, runs in by_parent.items():
        parent = model.get_submodule(path)
        gm = fx.GraphModule(parent, _trace_children(parent))
        prefix = f"{path}." if path else ""
        for i, (members, mode) in enumerate(runs):
            names = [m[len(prefix) :] for m in members]
            nodes = [
                next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == t) for t in names
            ]
            gm.add_submodule(f"_ptt_run{i}", _Run([parent.get_submodule(t) for t in names], mode))
            with gm.graph.inserting_before(nodes[0]):
                new = gm.graph.call_module(f"_ptt_run{i}", nodes[0].args, {})
            nodes[-1].replace_all_uses_with(new)
            for n in reversed(nodes):
                gm.graph.erase_node(n)
        gm.graph.lint()
        gm.recompile()
        parent.__dict__["_ptt_traced"] = (gm, parent.forward, parent.training)
        parent.__dict__["_ptt_traced_prev"] = parent.__dict__.get("forward")
        parent.forward = types.MethodType(_traced_forward, parent)  # type: ignore[method-assign]
    for members, mode in plan:
        if len(members) == 1:
            m = model.get_submodule(members[0])
            m.__dict__["_ptt_region"] = (m.forward, mode)
            m.__dict__["_ptt_region_prev"] = m.__dict__.get("forward")
            m.forward = types.MethodType(_module_forward, m)  # type: ignore[method-assign]


def unapply(model: nn.Module) -> None:
    """Undo ``apply``: every wrapped forward back as it was (a module's wrapper first, then its traced runs)."""
    for m in model.modules():
        for key, prev in (("_ptt_region", "_ptt_region_prev"), ("_ptt_traced", "_ptt_traced_prev")):
            if key not in m.__dict__:
                continue
            del m.__dict__[key]
            saved = m.__dict__.pop(prev)
            if saved is None:
                m.__dict__.pop("forward", None)
            else:
                m.__dict__["forward"] = saved
