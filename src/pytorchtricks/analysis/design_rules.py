"""ShuffleNetV2's guideline experiments (G1-G4) as equal-FLOPs module pairs, and ``ptt lint --measure``.

Each experiment is a set of variants with the same FLOPs (within rounding) but different memory access cost (MAC,
in ShuffleNetV2's sense: bytes read and written). ``benchmarks/design_rules.py`` times them all on this machine;
``measure_findings`` times the user's own G1/G2 layers against their equal-FLOPs alternative, so the linter's
claims are checked on the user's hardware instead of asserted. Timing goes through ``clock.compare``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytorchtricks.analysis.flops import count_flops
from pytorchtricks.analysis.lint_rules import Finding

__all__ = ["Variant", "experiments", "measure_findings"]


@dataclass
class Variant:
    """One module + input of an experiment; ``flops``/``mac_bytes`` come from ``count_flops``."""

    name: str
    module: nn.Module
    x: torch.Tensor
    flops: int = 0
    mac_bytes: int = 0

    def __post_init__(self) -> None:
        self.module.eval()
        r = count_flops(self.module, self.x)
        self.flops, self.mac_bytes = r.flops, r.bytes

    def fn(self) -> Callable[[], Any]:
        module, x = self.module, self.x

        def run() -> Any:
            with torch.no_grad():
                return module(x)

        return run


def _conv1x1(c_in: int, c_out: int, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, groups=groups, bias=False)


class _Parallel(nn.Module):
    def __init__(self, c: int, k: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(_conv1x1(c, c // k) for _ in range(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


class _Bottleneck(nn.Module):
    """ResNet bottleneck (1x1 -> 3x3 -> 1x1) with optional ReLUs and shortcut, for G4."""

    def __init__(self, c: int, relu: bool, shortcut: bool) -> None:
        super().__init__()
        mid = c // 4
        self.convs = nn.ModuleList(
            [_conv1x1(c, mid), nn.Conv2d(mid, mid, 3, padding=1, bias=False), _conv1x1(mid, c)]
        )
        self.relu, self.shortcut = relu, shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for i, conv in enumerate(self.convs):
            y = conv(y)
            if self.relu and i < 2:
                y = torch.relu(y)
        if self.shortcut:
            y = y + x
        return torch.relu(y) if self.relu else y


def experiments(size: str = "smoke") -> dict[str, list[Variant]]:
    """The four experiments; the first variant of each is the guideline-following baseline."""
    batch, hw = (4, 28) if size == "smoke" else (8, 56)
    torch.manual_seed(0)

    def img(c: int) -> torch.Tensor:
        return torch.randn(batch, c, hw, hw)

    g1 = []  # two stacked 1x1 convs c1 -> c2 -> c1 with c1 * c2 fixed: FLOPs equal, MAC lowest at 1:1
    for r in (1, 2, 6, 12):
        c1 = round(128 / math.sqrt(r))
        c2 = round(128 * math.sqrt(r))
        g1.append(
            Variant(
                f"c1:c2 = 1:{r} ({c1}->{c2}->{c1})",
                nn.Sequential(_conv1x1(c1, c2), _conv1x1(c2, c1)),
                img(c1),
            )
        )
    g2 = []  # 1x1 group conv with c^2 / g fixed: FLOPs equal, MAC grows with g
    for g, c in ((1, 128), (2, 180), (4, 256), (8, 360)):
        g2.append(Variant(f"groups {g} ({c} channels)", _conv1x1(c, c, groups=g), img(c)))
    c = 128
    g3 = [  # same FLOPs split into k series or parallel fragments: more kernels, less parallel work each
        Variant("1 fragment", _conv1x1(c, c), img(c)),
        Variant("2 in series", nn.Sequential(*[_conv1x1(90, 90) for _ in range(2)]), img(90)),
        Variant("4 in series", nn.Sequential(*[_conv1x1(64, 64) for _ in range(4)]), img(64)),
        Variant("2 in parallel", _Parallel(c, 2), img(c)),
        Variant("4 in parallel", _Parallel(c, 4), img(c)),
    ]
    g4 = [
        Variant(f"bottleneck, relu={relu}, shortcut={sc}", _Bottleneck(256, relu, sc), img(256))
        for relu, sc in ((False, False), (True, False), (False, True), (True, True))
    ]
    return {
        "G1 equal channel width": g1,
        "G2 group convolution": g2,
        "G3 fragmentation": g3,
        "G4 element-wise": g4,
    }


def measure_findings(
    model: nn.Module,
    example_inputs: Any,
    findings: list[Finding],
    *,
    limit: int = 4,
    rounds: int = 3,
    min_run_time_s: float = 0.05,
) -> list[Finding]:
    """Time up to ``limit`` G1/G2 findings' layers against their equal-FLOPs alternative; fills ``measured``.

    Each layer is rebuilt at its own input shape (batch included, read by one forward over ``example_inputs``)
    with random weights, and timed interleaved with the alternative, forward only, under ``no_grad``.
    """
    from pytorchtricks.clock import compare

    modules = dict(model.named_modules())
    todo = [f for f in findings if f.id in ("PTL004", "PTL005") and f.location in modules]
    todo = sorted(todo, key=lambda f: -f.cost_bytes)[:limit]
    if not todo:
        return findings
    shapes = _input_shapes(model, example_inputs)
    for f in todo:
        layer, shape = modules[f.location], shapes.get(f.location)
        if not isinstance(layer, nn.Conv2d) or shape is None:
            continue
        x = torch.randn(shape)
        c1, c2, g = layer.in_channels, layer.out_channels, layer.groups
        geometry: dict[str, Any] = {
            "kernel_size": layer.kernel_size,
            "stride": layer.stride,
            "padding": layer.padding,
        }
        if f.id == "PTL004":
            c = max(1, round(math.sqrt(c1 * c2)))
            alt, alt_x, label = _conv1x1(c, c), torch.randn(shape[0], c, *shape[2:]), f"{c}->{c} conv"
        else:
            alt = nn.Conv2d(c1, max(1, c2 // g), bias=False, **geometry)
            alt_x, label = x, f"dense {c1}->{max(1, c2 // g)} conv"
        same = nn.Conv2d(c1, c2, groups=g, bias=False, **geometry)
        res = compare(
            {"baseline": Variant("alt", alt, alt_x).fn(), "layer": Variant("layer", same, x).fn()},
            rounds=rounds,
            min_run_time_s=min_run_time_s,
            warmup=1,
        )
        v = res["layer"]
        f.measured = (
            f"{1 / v.ratio:.2f}x the time of an equal-FLOPs {label} here (paired ratio IQR "
            f"{1 / v.ratio_q3:.2f}-{1 / v.ratio_q1:.2f}, {rounds} interleaved rounds)"
        )
    return findings


def _input_shapes(model: nn.Module, example_inputs: Any) -> dict[str, tuple[int, ...]]:
    from pytorchtricks.analysis._probe import ModuleTracker, as_args, preserved_state

    tracker = ModuleTracker(model)
    with preserved_state(model), torch.no_grad(), tracker:
        model(*as_args(example_inputs))
    return {p: calls[0][0] for p, calls in tracker.call_inputs.items() if calls and calls[0]}
