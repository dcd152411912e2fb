"""Export a model to ONNX and prove ONNX Runtime gives the same answers (plus ONNX Runtime static int8).

Why: ONNX Runtime is a strong CPU inference engine with no Python in the loop (ResNet-18 layout, 1 thread:
static int8 QDQ 5.93x / 4.17x over eager fp32 at batch 1 / 8), and ONNX is what serving stacks take.
When: deploying outside PyTorch, or as a peer to check ``quantize`` against.
Caveats: ``torch.onnx.export`` defaults to the dynamo exporter in torch >= 2.9 (needs ``onnxscript``); shapes are
static unless ``dynamic_batch=True``. The exported file is checked against PyTorch on the example inputs (max abs
diff, SQNR) before this returns. ORT dynamic int8 on CNNs is slower than fp32 (0.34-0.50x): use static int8 with
calibration data. Needs the ``infer`` extra (onnx, onnxruntime, onnxscript).
See also: quantize, fuse_conv_bn, 推理加速 / 部署.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from pytorchtricks.core import BenchCase, PttError, TrickInfo, require

__all__ = ["export_onnx", "OnnxRunner", "quantize_onnx_static"]

TRICK = TrickInfo(gains=("speed",), phase=("infer",), exact=True, needs=("infer",))


class OnnxRunner:
    """Call an ONNX file like a model: torch tensors in, torch tensors out (one ORT session, CPU by default).

    ``threads`` sets ORT's intra-op threads (default: ``torch.get_num_threads()``, so A/B runs are fair).
    """

    def __init__(
        self, path: str, *, threads: int | None = None, providers: Sequence[str] = ("CPUExecutionProvider",)
    ):
        ort = require("onnxruntime", "infer")
        self.path = path
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, sess_options=opts, providers=list(providers))
        self.input_names = [i.name for i in self.session.get_inputs()]

    def __call__(self, *args: torch.Tensor) -> Any:
        if len(args) != len(self.input_names):
            raise PttError(f"the ONNX model takes {len(self.input_names)} inputs, got {len(args)}.")
        feeds = {n: a.detach().cpu().numpy() for n, a in zip(self.input_names, args)}
        outs = [torch.from_numpy(np.asarray(o)) for o in self.session.run(None, feeds)]
        return outs[0] if len(outs) == 1 else tuple(outs)


def _atomic_path(path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".onnx.tmp")
    os.close(fd)
    return tmp


def export_onnx(
    model: nn.Module,
    example_inputs: Any,
    path: str,
    *,
    dynamic_batch: bool = False,
    opset: int | None = None,
    check: bool = True,
    atol: float = 1e-4,
) -> Any:
    """Export ``model`` to ``path`` (atomic write) and check ONNX Runtime against PyTorch; returns the report.

    Example:
        >>> import tempfile, os
        >>> m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> ptt.export_onnx(m, torch.randn(1, 3, 8, 8), path).ok
        True
    """
    require("onnx", "infer")
    require("onnxscript", "infer")
    if model.training:
        raise PttError("export_onnx needs model.eval() (BN statistics and dropout are baked into the graph).")
    from pytorchtricks.safety import check_transform, reference_outputs

    example = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch")
        dynamic_shapes = tuple({0: batch} if isinstance(a, torch.Tensor) else None for a in example)
    tmp = _atomic_path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                example,
                tmp,
                dynamo=True,
                opset_version=opset,
                dynamic_shapes=dynamic_shapes,
                external_data=False,
                verbose=False,
            )
        os.replace(tmp, path)
    except Exception as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, PttError):
            raise
        raise PttError(
            f"ONNX export failed ({type(exc).__name__}: {str(exc)[:300]}); unshare reused modules "
            "(ptt.unshare_modules_) and make the forward traceable by torch.export."
        ) from exc
    if not check:
        return None
    ref = reference_outputs(model, example)
    try:
        runner = OnnxRunner(path)
        return check_transform(runner, example, ref, step="export_onnx", max_abs_diff=atol)
    except PttError:
        raise
    except Exception as exc:  # ONNX Runtime could not load or run what torch.onnx wrote
        raise PttError(
            f"ONNX Runtime cannot run the exported {path} ({type(exc).__name__}: {str(exc)[:300]}); try another "
            "opset= or export with check=False and inspect the file."
        ) from exc


class _Reader:
    def __init__(self, names: list[str], batches: list[tuple[torch.Tensor, ...]]) -> None:
        self._it = iter([{n: t.numpy() for n, t in zip(names, b)} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # pragma: no cover - ORT calls it for some calibration methods only
        pass


def quantize_onnx_static(
    path_in: str,
    path_out: str,
    calibration: Iterable[Any],
    *,
    per_channel: bool = True,
    max_batches: int = 32,
) -> str:
    """ONNX Runtime static int8 (QDQ, uint8 activations, int8 per-channel weights), calibrated on real batches."""
    ortq = require("onnxruntime.quantization", "infer", package="onnxruntime")
    names = [i.name for i in OnnxRunner(path_in).session.get_inputs()]
    batches: list[tuple[torch.Tensor, ...]] = []
    for item in calibration:
        b = (item,) if isinstance(item, torch.Tensor) else tuple(item[: len(names)])
        batches.append(tuple(t.detach().cpu() for t in b))
        if len(batches) >= max_batches:
            break
    if not batches:
        raise PttError("calibration is empty; pass a few batches of real inputs.")
    tmp = _atomic_path(path_out)
    ortq.quantize_static(
        path_in,
        tmp,
        _Reader(names, batches),
        quant_format=ortq.QuantFormat.QDQ,
        activation_type=ortq.QuantType.QUInt8,
        weight_type=ortq.QuantType.QInt8,
        per_channel=per_channel,
    )
    os.replace(tmp, path_out)
    return path_out


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Eager PyTorch fp32 vs the same small CNN in ONNX Runtime fp32 (CPU)."""
    from pytorchtricks.fixtures import randomize_bn_, small_cnn

    if device != "cpu":
        raise PttError("export_onnx benchmarks ONNX Runtime on CPU; use --device cpu.")
    width, hw, batch = (16, 32, 8) if size == "smoke" else (64, 64, 16)
    torch.manual_seed(0)
    base = randomize_bn_(small_cnn(in_channels=3, width=width)).eval()
    x = torch.randn(batch, 3, hw, hw)
    path = os.path.join(tempfile.mkdtemp(prefix="ptt-onnx-"), "model.onnx")
    export_onnx(copy.deepcopy(base), x, path)
    runner = OnnxRunner(path)

    def run_base() -> torch.Tensor:
        with torch.no_grad():
            return base(x)

    return BenchCase(
        baseline=run_base,
        treated=lambda: runner(x),
        items_per_call=batch,
        unit="images",
        device=device,
        description=f"small_cnn width {width}, {hw}px, batch {batch}: eager vs ONNX Runtime",
        check=lambda a, b: torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4),
        cleanup=lambda: shutil.rmtree(os.path.dirname(path), ignore_errors=True),
    )
