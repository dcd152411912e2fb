"""Balanced int8 ranges for CPUs without VNNI: each activation a conv/linear reads gets 0..127 to 0..255 levels and
its weights what is left inside AVX2's int16 pair sums, chosen by that layer's own output error on captured
calibration inputs; optional MSE weight ranges and bias correction (``quantize``'s default there, via ``int8_range``,
and on its uniform ranges too: one level choice, weights refined the same way).

Not a trick (leading underscore): the part of ``quantize``'s static int8 flow that works on a calibrated PT2E graph.
Measured on ResNet-18 (results/avx2/int8_no_vnni.md): 36.45 dB through the AVX2 kernels vs 31.73 dB with 7-bit
activations everywhere.
"""

from __future__ import annotations

from typing import Any

import torch

from pytorchtricks.core import PttError

# the activation levels ("balanced") tries for each activation that a conv / linear reads; its weights get the rest
ACT_QMAX_CHOICES = (127, 159, 191, 223, 255)


def weight_absmax_for(act_qmax: int) -> int:
    """The largest weight magnitude that AVX2's int16 pair sums take exactly with activations in 0..act_qmax.

    ``vpmaddubsw`` adds two u8 x s8 products into int16: exact while 2 * act_qmax * weight_absmax <= 32767, so
    7-bit activations keep 8-bit weights (-128..127) and 8-bit activations get 7-bit ones (-64..64).

    Example:
        >>> [weight_absmax_for(q) for q in (127, 191, 255)]
        [128, 85, 64]
    """
    return min(128, 32767 // (2 * act_qmax))


def _matmul_sites(prepared: Any) -> dict[str, list[tuple[Any, str]]]:
    """The conv/linear nodes of a prepared PT2E graph, grouped by the activation observer they read.

    Returns ``{activation observer name: [(conv/linear node, weight observer name), ...]}``; ops whose input or
    weight is not observed (left in float) are not listed.
    """
    aten = torch.ops.aten
    sites: dict[str, list[tuple[Any, str]]] = {}
    for node in prepared.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.conv2d.default, aten.linear.default):
            continue
        x, w = node.args[0], node.args[1]
        if getattr(x, "op", None) == "call_module" and getattr(w, "op", None) == "call_module":
            sites.setdefault(str(x.target), []).append((node, str(w.target)))
    return sites


def _set_levels(prepared: Any, act: str, act_qmax: int, weights: list[str], int16: bool = True) -> None:
    """Set an activation observer to 0..act_qmax and its consumers' weight observers to what fits with it
    (``int16``: inside AVX2's int16 pair sums; else 8-bit weights, as VNNI's int32 sums take)."""
    obs = prepared.get_submodule(act)
    obs.quant_max = act_qmax
    if hasattr(obs, "dst_nbins"):  # the histogram's range search for as many levels as there are
        obs.dst_nbins = act_qmax + 1
    wmax = weight_absmax_for(act_qmax) if int16 else 128
    for name in weights:
        wobs = prepared.get_submodule(name)
        wobs.quant_min, wobs.quant_max = (-128, 127) if wmax >= 128 else (-wmax, wmax)


def _clip_weights(wobs: Any, w: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
    """Per output channel, the weight range (a fraction of min/max) with the least squared rounding error."""
    qmin, qmax = int(wobs.quant_min), int(wobs.quant_max)
    flat = w.detach().reshape(w.shape[0], -1)
    amax = torch.maximum(-lo, hi).clamp_min(1e-12)
    best, best_err = torch.ones_like(amax), torch.full_like(amax, float("inf"))
    for frac in torch.linspace(0.5, 1.0, 21).tolist():
        scale = (frac * amax / ((qmax - qmin) / 2)).clamp_min(float(wobs.eps))[:, None]
        q = (flat / scale).round_().clamp_(qmin, qmax).mul_(scale).sub_(flat)
        err = q.mul_(q).sum(1)
        better = err < best_err
        best = torch.where(better, torch.full_like(amax, frac), best)
        best_err = torch.where(better, err, best_err)
    wobs.min_val, wobs.max_val = lo * best, hi * best


def _fake_quant_weight(wobs: Any, w: torch.Tensor) -> torch.Tensor:
    scale, zp = wobs.calculate_qparams()
    return torch.fake_quantize_per_channel_affine(
        w, scale.float(), zp.int(), int(wobs.ch_axis), int(wobs.quant_min), int(wobs.quant_max)
    )


def _value(prepared: Any, a: Any) -> Any:
    """A node argument's value for a re-run of one op: parameters read, observers seen through, literals kept."""
    from pytorchtricks.tricks.model.onednn_plan.lowering import _attr_of

    if getattr(a, "op", None) == "get_attr":
        return _attr_of(prepared, str(a.target))
    if getattr(a, "op", None) == "call_module":
        return _value(prepared, a.args[0])
    return a


def balance_ranges_(
    prepared: Any,
    captured: dict[str, torch.Tensor],
    *,
    clip_weights: bool = False,
    correct_bias: bool = False,
    choices: tuple[int, ...] = ACT_QMAX_CHOICES,
    int16: bool = True,
) -> dict[str, tuple[int, int]]:
    """Give each activation that a conv/linear of a calibrated PT2E graph reads its levels (``"balanced"``), in place.

    ``captured``: some calibration inputs of each activation observer (by name). For each observer and each of
    ``ACT_QMAX_CHOICES`` the observer's own range search picks scale and zero point for that many levels, its
    consumers' weights get ``weight_absmax_for`` it, and the summed relative output error of those consumers on
    the captured inputs decides. Activation rounding noise and weight rounding noise both enter at the layer's
    output, so whatever the net does downstream amplifies both alike: the layer's own error is the measure.
    ``clip_weights``: each output channel's weight range shrunk to the least squared rounding error (else min/max);
    ``correct_bias``: each consumer's bias less the mean output error the rounding adds on the captured inputs.
    ``choices``: the activation levels tried; ``int16=False``: weights keep 8 bits whatever the activations get
    (what VNNI's int32 sums compute exactly; saturates on AVX2 - for measuring only). Returns ``{conv/linear node name: (activation qmax, weight magnitude
    max)}``; observers not captured (or read by a conv/linear whose weight or bias the graph computes) get the fewest
    activation levels of ``choices``.
    """
    sites = _matmul_sites(prepared)
    instances: dict[int, list[str]] = {}  # one observer instance may sit at several places (shared qparams)
    for act in sites:
        instances.setdefault(id(prepared.get_submodule(act)), []).append(act)
    chosen: dict[str, tuple[int, int]] = {}
    for names in instances.values():
        consumers = [(node, w, captured.get(act)) for act in names for node, w in sites[act]]
        best = _Balance(prepared, names[0], consumers, clip_weights, int16).run(correct_bias, choices)
        for node, _, _ in consumers:
            chosen[node.name] = (best, weight_absmax_for(best) if int16 else 128)
    return chosen


class _Balance:
    """One activation observer of ``balance_ranges_``, the conv/linear nodes that read it and their inputs."""

    def __init__(
        self,
        prepared: Any,
        act: str,
        consumers: list[tuple[Any, str, torch.Tensor | None]],
        clip_weights: bool,
        int16: bool = True,
    ) -> None:
        self.prepared, self.act, self.consumers, self.clip_weights = prepared, act, consumers, clip_weights
        self.int16 = int16
        self.weights = [w for _, w, _ in consumers]
        self.wobs = [prepared.get_submodule(w) for w in self.weights]
        self.ranges = [(o.min_val.clone(), o.max_val.clone()) for o in self.wobs]
        # a weight or bias computed in the graph (not a parameter): not re-run, its activation gets 7 bits (exact)
        constant = [
            all(
                getattr(a, "op", None) == "get_attr"
                for a in [n.args[1].args[0], *n.args[2:]]
                if isinstance(a, torch.fx.Node)
            )
            for n, _, _ in consumers
        ]
        self.floats = [
            _value(prepared, n.args[1]) if c else None
            for (n, _, _), c in zip(consumers, constant, strict=True)
        ]
        self.measured = all(constant) and all(x is not None for _, _, x in consumers)
        self.refs: dict[str, torch.Tensor] = {}

    def set_levels(self, qmax: int) -> None:
        _set_levels(self.prepared, self.act, qmax, self.weights, self.int16)
        for o, (lo, hi), w in zip(self.wobs, self.ranges, self.floats, strict=True):
            if self.clip_weights and w is not None:
                _clip_weights(o, w, lo, hi)
            else:
                o.min_val, o.max_val = lo, hi

    def outputs(self, qmax: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(float output, output with rounded input and weights) of each consumer on its captured inputs."""
        scale, zp = self.prepared.get_submodule(self.act).calculate_qparams()
        pairs = []
        for (node, _, x), o, w in zip(self.consumers, self.wobs, self.floats, strict=True):
            if x is None or w is None:
                raise PttError(f"{node.name}: no captured calibration input or constant weight to measure on")
            xq = torch.fake_quantize_per_tensor_affine(x, float(scale), int(zp), 0, qmax)
            rest = [_value(self.prepared, a) for a in node.args[2:]]
            if node.name not in self.refs:  # the float output does not depend on the levels (nor on the bias
                self.refs[node.name] = node.target(x, w, *rest)  # correction, which comes after)
            pairs.append((self.refs[node.name], node.target(xq, _fake_quant_weight(o, w), *rest)))
        return pairs

    def run(self, correct_bias: bool, choices: tuple[int, ...]) -> int:
        best = min(choices)
        if self.measured and len(choices) > 1:  # one choice (uniform ranges): nothing to measure between
            errors = {}
            for qmax in choices:
                self.set_levels(qmax)
                errors[qmax] = sum(
                    float(((got - ref) ** 2).sum() / (ref**2).sum().clamp_min(1e-30))
                    for ref, got in self.outputs(qmax)
                )
            best = min(errors, key=lambda q: errors[q])
        self.set_levels(best)
        if correct_bias and self.measured:
            for (node, _, _), (ref, got) in zip(self.consumers, self.outputs(best), strict=True):
                bias = node.args[2] if len(node.args) > 2 else None
                if getattr(bias, "op", None) != "get_attr":
                    continue  # no bias to carry the correction
                linear = node.target == torch.ops.aten.linear.default  # channels last; conv: dim 1
                dims = list(range(ref.dim() - 1)) if linear else [d for d in range(ref.dim()) if d != 1]
                _value(self.prepared, bias).data.sub_((got - ref).mean(dims))
        return best


def capture_inputs(prepared: Any, samples: int) -> tuple[dict[str, list[torch.Tensor]], list[Any]]:
    """Forward hooks that keep the first ``samples`` calibration inputs of each observer a conv/linear reads.

    One observer instance may sit at several places (a pool's output shares its input's observer): the hook counts
    the instance's calls in graph order and keeps only the call that feeds the conv/linear.
    """
    calls: dict[
        int, list[str]
    ] = {}  # observer instance -> the observer node names calling it, in graph order
    for node in prepared.graph.nodes:
        if node.op == "call_module":
            calls.setdefault(id(prepared.get_submodule(str(node.target))), []).append(str(node.target))
    wanted = set(_matmul_sites(prepared))
    captured: dict[str, list[torch.Tensor]] = {}
    handles = []
    for names in calls.values():
        if not wanted.intersection(names):
            continue
        count = [0]

        def keep(_m: Any, inputs: Any, _out: Any, names: list[str] = names, count: list[int] = count) -> None:
            act = names[count[0] % len(names)]
            count[0] += 1
            x = inputs[0] if inputs else None
            if act not in wanted or not isinstance(x, torch.Tensor) or x.dim() == 0:
                return
            kept = captured.setdefault(act, [])
            have = sum(t.shape[0] for t in kept)
            if have < samples and (
                not kept or kept[0].shape[1:] == x.shape[1:]
            ):  # one shape: they are concatenated
                kept.append(x.detach()[: samples - have].clone())

        handles.append(prepared.get_submodule(names[0]).register_forward_hook(keep))
    return captured, handles


BALANCE_SAMPLES = 8  # calibration samples per activation that balance_ranges_ measures layer errors on
