"""A oneDNN plan for a PT2E static-int8 graph: each int8 op becomes one primitive, built once, run in one loop.

Why: PyTorch's int8 ops (``onednn::qconv*``) rebuild a oneDNN primitive descriptor and their scale arguments on
every call - about 40 us per op on ResNet-18 (results/int8_breakdown.md) - while ONNX Runtime's per-op cost is near
zero. Here the quantized graph is lowered once: weights reordered to the kernel's layout, scales, zero points,
residual adds (``sum`` post-op) and activations baked into primitive attributes, activation buffers allocated; a
call is then one ``dnnl_primitive_execute`` per op. The library is the system oneDNN 2.x (Debian ``libdnnl2``),
loaded with ctypes through its C API - PyTorch's own copy of oneDNN does not export its symbols.

Supported ops (anything else raises ``PlanUnsupported`` and the caller keeps its compiled path): input quantize,
conv2d (+ add of a quantized tensor) (+ relu / relu6-hardtanh / hardswish / silu / gelu, before or after the add)
with uint8 or float output, grouped and depthwise convs, linear (+ the same activations), max_pool2d, global mean,
adaptive_avg_pool2d with a whole-number window, flatten of a 1x1 map, inference dropout, output dequantize.
Activations are uint8 (per-tensor scale and zero point; 0..qmax, qmax <= 255), weights int8 symmetric per output
channel - what the x86 PT2E quantizer makes. Without VNNI a conv/linear is lowered only where 2 x qmax x its largest
|weight| <= 32767: the AVX2 kernels' int16 pair sums saturate beyond (``saturation_risk``; ``quantize``'s balanced
ranges and ``reduce_range`` both stay inside).
"""

from pytorchtricks.tricks.model.onednn_plan.binding import PlanUnsupported, onednn_available
from pytorchtricks.tricks.model.onednn_plan.executor import OnednnPlan
from pytorchtricks.tricks.model.onednn_plan.lowering import build_plan, rounding_sqnr_db, saturation_risk

__all__ = [
    "OnednnPlan",
    "PlanUnsupported",
    "build_plan",
    "onednn_available",
    "rounding_sqnr_db",
    "saturation_risk",
]
