"""``ptt optimize``: every applicable inference engine built as a file, checked, timed, and the fastest one handed back.

Each candidate is written as the artefact it would be handed back as (``artefacts``: a ``torch.export`` program,
an AOTInductor package, an ONNX file, an int8 program for the oneDNN plan), loaded back from that file, checked
(SQNR of its outputs against eager fp32 over held-out inputs, the caller's inputs unchanged) and timed interleaved
with eager fp32 (``clock.compare``) at the requested batch and threads - so the numbers are the numbers of what the
user gets. The fastest candidate that meets the bound wins; the receipt holds the whole table.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import PttError
from pytorchtricks.infer import artefacts

PRECISIONS = ("fp32", "bf16", "int8", "any")
ENGINES = ("eager", "aoti", "onednn", "ort")
ENGINE_GROUPS = {"torch": ("eager", "aoti", "onednn")}
FP32_MIN_SQNR_DB = (
    60.0  # an fp32 rewrite differs only by float reassociation (>= 100 dB seen): below this it is wrong
)
DEFAULT_MIN_SQNR_DB = 30.0  # int8 / bf16 default bound


@dataclass
class Row:
    """One candidate: what it is, what its check measured, how fast its loaded file ran, and its verdict."""

    name: str
    engine: str
    kind: str
    precision: str
    status: str = "ok"  # "ok", or "refused: <why>" (not built, failed its check, below the bound)
    sqnr_db: float | None = None
    inputs_unchanged: bool | None = None
    median_ms: float | None = None
    speedup: float | None = None  # vs eager fp32 (paired, median of rounds)
    speedup_q1: float | None = None
    speedup_q3: float | None = None
    build_s: float | None = None
    path: str | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass
class Candidate:
    name: str
    engine: str
    kind: str
    precision: str
    write: Callable[[str], str]  # path -> path written
    needs: Callable[[], str | None] = lambda: None  # why it cannot be built here, or None


def parse_engines(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"torch,ort"`` -> the engines it names (``torch`` = eager, aoti, onednn).

    Example:
        >>> parse_engines("torch,ort")
        ('eager', 'aoti', 'onednn', 'ort')
    """
    if text is None:
        return ENGINES
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in (i.strip() for i in items if i.strip()):
        group = ENGINE_GROUPS.get(item, (item,))
        for e in group:
            if e not in ENGINES:
                raise PttError(f"unknown engine {item!r}; use {', '.join((*ENGINE_GROUPS, *ENGINES))}.")
            if e not in out:
                out.append(e)
    if not out:
        raise PttError("--engines names no engine; e.g. --engines torch,ort.")
    return tuple(out)


def _onednn_missing() -> str | None:
    from pytorchtricks.tricks.model.onednn_plan import onednn_available

    return (
        None
        if onednn_available()
        else "the system oneDNN (libdnnl2) is not installed: apt-get install libdnnl2"
    )


def _ort_missing() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "ONNX Runtime is not installed: pip install 'pytorchtricks[infer]'"
    return None


def _bf16_missing() -> str | None:
    from pytorchtricks.hardware import cpu_caps

    caps = cpu_caps()
    if caps.native_bf16:
        return None
    return (
        f"this CPU ({caps.cpu_class}) has no native bf16: bf16 runs emulated through fp32, several times slower "
        "(ResNet-18: 0.11-0.20x of fp32 on AVX2)"
    )


class _Sources:
    """What several candidates write from, each built once, on first use: the PT2E int8 graph (both torch int8
    engines take it; calibration is slow) and the fp32 ONNX file (ORT fp32, and ORT int8 quantizes it)."""

    def __init__(
        self, fp32: nn.Module, example: tuple[Any, ...], calibration: Sequence[Any], tmp: str
    ) -> None:
        self.fp32, self.example, self.calibration, self.tmp = fp32, example, calibration, tmp
        self._int8: Any = None

    def int8_program(self) -> Any:
        from pytorchtricks.tricks.model.quantize import QuantConfig, quantize

        if self._int8 is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = quantize(
                    copy.deepcopy(self.fp32),
                    self.example,
                    QuantConfig(
                        calibration=list(self.calibration), backend="pt2e", engine="eager", check=False
                    ),
                )
            self._int8 = q.inner
        return self._int8

    def onnx_fp32(self, path: str) -> str:
        fp32_onnx = os.path.join(self.tmp, "fp32.onnx")
        if not os.path.isfile(fp32_onnx):
            artefacts.write_onnx(self.fp32, self.example, fp32_onnx)
        shutil.copyfile(fp32_onnx, path)
        return path

    def onnx_int8(self, path: str) -> str:
        fp32 = self.onnx_fp32(os.path.join(self.tmp, "fp32-for-int8.onnx"))
        return artefacts.write_onnx_int8(fp32, self.calibration, path)


def candidates(
    fp32: nn.Module,
    example: tuple[Any, ...],
    calibration: Sequence[Any],
    *,
    precision: str,
    engines: Sequence[str],
    tmp: str,
) -> list[Candidate]:
    """The candidates for ``precision`` and ``engines``: ``fp32`` is the fused, re-parameterized fp32 model."""
    src = _Sources(fp32, example, calibration, tmp)
    out: list[Candidate] = []
    if precision in ("fp32", "any"):
        out += _fp32_candidates(src, engines)
    if precision in ("bf16", "any"):
        out += _bf16_candidates(src, engines)
    if precision in ("int8", "any"):
        out += _int8_candidates(src, engines)
    return out


def _fp32_candidates(src: _Sources, engines: Sequence[str]) -> list[Candidate]:
    """fp32 as exported (eager) and AOTInductor-compiled, each as given and channels_last; ORT fp32."""
    fp32, example = src.fp32, src.example
    out: list[Candidate] = []
    if "eager" in engines:
        out.append(
            Candidate(
                "eager fp32", "eager", "export", "fp32", lambda p: artefacts.write_export(fp32, example, p)
            )
        )
        out.append(
            Candidate(
                "eager fp32 channels_last",
                "eager",
                "export",
                "fp32",
                lambda p: artefacts.write_export(artefacts.ChannelsLast(copy.deepcopy(fp32)), example, p),
            )
        )
    if "aoti" in engines:
        out.append(
            Candidate(
                "AOTInductor fp32", "aoti", "aoti", "fp32", lambda p: artefacts.write_aoti(fp32, example, p)
            )
        )
        out.append(
            Candidate(
                "AOTInductor fp32 channels_last",
                "aoti",
                "aoti",
                "fp32",
                lambda p: artefacts.write_aoti(artefacts.ChannelsLast(copy.deepcopy(fp32)), example, p),
            )
        )
    if "ort" in engines:
        out.append(Candidate("ORT fp32", "ort", "onnx", "fp32", src.onnx_fp32, _ort_missing))
    return out


def _bf16_candidates(src: _Sources, engines: Sequence[str]) -> list[Candidate]:
    """bf16 weights, AOTInductor-compiled (refused on a CPU without native bf16)."""
    if "aoti" not in engines:
        return []

    def write(p: str) -> str:
        return artefacts.write_aoti(artefacts.Cast(copy.deepcopy(src.fp32), torch.bfloat16), src.example, p)

    return [Candidate("AOTInductor bf16", "aoti", "aoti", "bf16", write, _bf16_missing)]


def _int8_candidates(src: _Sources, engines: Sequence[str]) -> list[Candidate]:
    """int8: the PT2E program as a oneDNN plan and AOTInductor-compiled; ORT static int8 of the fp32 ONNX."""
    example = src.example
    out: list[Candidate] = []
    if "onednn" in engines:
        out.append(
            Candidate(
                "int8 oneDNN plan",
                "onednn",
                "onednn",
                "int8",
                lambda p: artefacts.write_export(src.int8_program(), example, p),
                _onednn_missing,
            )
        )
    if "aoti" in engines:
        out.append(
            Candidate(
                "AOTInductor int8",
                "aoti",
                "aoti",
                "int8",
                lambda p: artefacts.write_aoti(src.int8_program(), example, p),
            )
        )
    if "ort" in engines:
        out.append(Candidate("ORT int8 static", "ort", "onnx", "int8", src.onnx_int8, _ort_missing))
    return out


def bound_for(precision: str, min_sqnr_db: float | None) -> float:
    """The SQNR a candidate of ``precision`` must reach: fp32 rewrites must be exact up to float rounding."""
    floor = DEFAULT_MIN_SQNR_DB if min_sqnr_db is None else min_sqnr_db
    return max(floor, FP32_MIN_SQNR_DB) if precision == "fp32" else floor


def pick(rows: Sequence[Row], min_sqnr_db: float | None = None) -> Row | None:
    """The fastest row that is ``ok`` and meets its bound (``bound_for``); rows below it are marked refused.

    Example:
        >>> rows = [Row("a", "eager", "export", "fp32", sqnr_db=120, median_ms=10.0),
        ...         Row("b", "ort", "onnx", "int8", sqnr_db=25, median_ms=3.0),
        ...         Row("c", "aoti", "aoti", "int8", sqnr_db=33, median_ms=4.0)]
        >>> pick(rows, 30).name, rows[1].status
        ('c', 'refused: SQNR 25.0 dB < 30.0 dB')
    """
    for r in rows:
        if r.status == "ok" and r.sqnr_db is not None:
            need = bound_for(r.precision, min_sqnr_db)
            if not r.sqnr_db >= need:
                r.status = f"refused: SQNR {r.sqnr_db:.1f} dB < {need:.1f} dB"
    ok = [r for r in rows if r.status == "ok" and r.median_ms is not None]
    return min(ok, key=lambda r: r.median_ms or math.inf) if ok else None


def _check(
    fn: Callable[..., Any], held_out: Sequence[tuple[Any, ...]], refs: Sequence[Any]
) -> tuple[float, bool]:
    """SQNR of ``fn`` vs the eager fp32 outputs over every held-out batch, and whether every input was unchanged."""
    from pytorchtricks.safety import sqnr_db

    got, want, unchanged = [], [], True
    for batch, ref in zip(held_out, refs, strict=True):
        keep = tuple(a.clone() for a in batch)
        out = fn(*batch)
        unchanged = unchanged and all(torch.equal(a, k) for a, k in zip(batch, keep, strict=True))
        got += [t.detach().float().reshape(-1) for t in _tensors(out)]
        want += [t.detach().float().reshape(-1) for t in _tensors(ref)]
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want, strict=True)):
        raise PttError("its outputs do not have the shapes of the model's")
    return float(sqnr_db(torch.cat(got), torch.cat(want))), unchanged


def _tensors(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]


@dataclass
class Picked:
    """What ``pick_artefact`` found: every row, the winner (or None), and the settings it was measured under."""

    rows: list[Row]
    winner: Row | None
    input_shape: tuple[int, ...]
    threads: int
    rounds: int
    min_sqnr_db: float | None
    precision: str
    held_out: int
    calibrated_on: str
    environment: dict[str, Any] = field(default_factory=dict)

    def runner_up(self) -> Row | None:
        ok = [r for r in self.rows if r.status == "ok" and r.median_ms is not None and r is not self.winner]
        return min(ok, key=lambda r: r.median_ms or math.inf) if ok else None


def pick_artefact(
    model: nn.Module,
    example: torch.Tensor,
    *,
    calibration: Sequence[torch.Tensor] | None = None,
    held_out: Sequence[torch.Tensor] | None = None,
    precision: str = "fp32",
    engines: Sequence[str] = ENGINES,
    threads: int | None = None,
    min_sqnr_db: float | None = None,
    rounds: int = 5,
    min_run_time_s: float = 0.2,
    workdir: str | None = None,
    reuse_files: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Picked:
    """Build, check and time every candidate for ``precision`` / ``engines``; the fastest within the bound wins.

    ``calibration`` calibrates int8 (default: the example); ``held_out`` are the inputs the check runs on (default:
    the example). ``threads``: intra-op threads for every engine while checking and timing (default: torch's).
    ``workdir``: where the candidates' files are written (default: a new temporary folder); ``reuse_files``: a file
    already there is taken as built (a second call on the same model and example, e.g. at another thread count).
    """
    from pytorchtricks.clock import environment
    from pytorchtricks.safety import reference_outputs

    if precision not in PRECISIONS:
        raise PttError(f"unknown precision {precision!r}; use {', '.join(PRECISIONS)}.")
    say = progress or (lambda _msg: None)
    threads = threads or torch.get_num_threads()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = model.eval()
        example_t = (example,)
        calib = list(calibration or [example])
        checks = [(b,) for b in (held_out or [example])]
        refs = [reference_outputs(model, b) for b in checks]
        fp32 = _rewritten_fp32(model, example_t)
        tmp = workdir or tempfile.mkdtemp(prefix="ptt-optimize-")
        rows: list[Row] = []
        runners: dict[str, Callable[[], Any]] = {}
        for cand in candidates(fp32, example_t, calib, precision=precision, engines=engines, tmp=tmp):
            row = Row(cand.name, cand.engine, cand.kind, cand.precision)
            rows.append(row)
            fn = _build_and_check(cand, row, example, checks, refs, tmp, threads, reuse_files, say)
            if fn is not None:
                runners[cand.name] = (lambda f: lambda: f(example))(fn)
        pick(rows, min_sqnr_db)  # marks rows below their bound before timing: they are not timed
        timed = {r.name: runners[r.name] for r in rows if r.status == "ok"}
        say(f"timing {len(timed)} candidates vs eager fp32, {rounds} interleaved rounds, {threads} threads")
        baseline_row, measured_rounds = _time(rows, timed, model, example, rounds, min_run_time_s, threads)
        winner = pick(rows, min_sqnr_db)
        return Picked(
            [baseline_row, *rows],
            winner,
            tuple(example.shape),
            threads,
            measured_rounds,
            min_sqnr_db,
            precision,
            sum(b.shape[0] for (b,) in checks),
            "given batches" if calibration else "the example input",
            environment("cpu"),
        )
    finally:
        torch.set_num_threads(old_threads)


def _rewritten_fp32(model: nn.Module, example: tuple[Any, ...]) -> nn.Module:
    """A copy of ``model`` with reused modules unshared, Conv->BN folded and re-parameterized: what every
    candidate starts from (each rewrite that cannot trace the model is skipped)."""
    from pytorchtricks.tricks.model.fuse_conv_bn import fuse_conv_bn_
    from pytorchtricks.tricks.model.reparameterize import reparameterize_
    from pytorchtricks.tricks.model.unshare_modules import unshare_modules_

    fp32 = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no effect" of a rewrite is fine here: the candidates say the rest
        for step in (
            unshare_modules_,
            lambda m: fuse_conv_bn_(m, example),
            lambda m: reparameterize_(m, example),
        ):
            try:
                step(fp32)
            except PttError:
                pass  # not traceable: the candidates start from the model as it is
    return fp32


def _build_and_check(
    cand: Candidate,
    row: Row,
    example: torch.Tensor,
    checks: Sequence[tuple[Any, ...]],
    refs: Sequence[Any],
    tmp: str,
    threads: int,
    reuse_files: bool,
    say: Callable[[str], None],
) -> Callable[..., Any] | None:
    """Write ``cand``'s file, load it back and check it against the eager fp32 outputs, filling ``row``; the loaded
    callable, or ``None`` with ``row.status`` saying why it was refused."""
    from pytorchtricks.clock import now_s

    missing = cand.needs()
    if missing:
        row.status = f"refused: {missing}"
        say(f"{cand.name}: {row.status}")
        return None
    say(f"{cand.name}: building")
    path = os.path.join(tmp, cand.name.replace(" ", "-") + artefacts.EXTENSIONS[cand.kind])
    t0 = now_s()
    try:
        if not (reuse_files and os.path.isfile(path)):
            cand.write(path)
        fn = artefacts.load(cand.kind, path, input_shapes=[tuple(example.shape)], threads=threads)
        row.build_s = now_s() - t0
        row.sqnr_db, row.inputs_unchanged = _check(fn, checks, refs)
    except Exception as exc:  # a candidate that cannot be built or run is refused with why
        row.status = f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        say(f"{cand.name}: {row.status}")
        return None
    if not row.inputs_unchanged:
        row.status = "refused: it modified the caller's input"
        return None
    row.path = path
    return fn  # type: ignore[no-any-return]


_BASELINE = "eager fp32 (the model as given)"


def _time(
    rows: Sequence[Row],
    timed: dict[str, Callable[[], Any]],
    model: nn.Module,
    example: torch.Tensor,
    rounds: int,
    min_run_time_s: float,
    threads: int,
) -> tuple[Row, int]:
    """Time the ``timed`` runners interleaved with eager fp32 (``clock.compare``) and write each row's median and
    speedup; returns the baseline's own row and the rounds measured."""
    from pytorchtricks.clock import compare

    base = copy.deepcopy(model)

    def eager() -> Any:
        with torch.no_grad():
            return base(example)

    cmp = compare(
        {_BASELINE: eager, **timed},
        baseline=_BASELINE,
        rounds=rounds,
        min_run_time_s=min_run_time_s,
        num_threads=threads,
    )
    for r in rows:
        if r.name in cmp.variants:
            v = cmp[r.name]
            r.median_ms = v.stats.median_s * 1e3
            r.speedup, r.speedup_q1, r.speedup_q3 = v.ratio, v.ratio_q1, v.ratio_q3
    baseline_row = Row(_BASELINE, "eager", "module", "fp32", status="baseline")
    baseline_row.median_ms = cmp[_BASELINE].stats.median_s * 1e3
    baseline_row.speedup, baseline_row.sqnr_db, baseline_row.inputs_unchanged = 1.0, math.inf, True
    return baseline_row, cmp.rounds


def write_winner(picked: Picked, out: str, *, model_spec: str) -> tuple[str, str]:
    """Copy the winner's file to ``out`` (its extension added when missing) and write the receipt beside it."""
    win = picked.winner
    if win is None or win.path is None:
        raise PttError("no candidate met the bound; nothing to write (the table says why each was refused).")
    ext = artefacts.EXTENSIONS[win.kind]
    path = out if out.endswith(ext) else out + ext
    artefacts.atomic_copy(win.path, path)
    receipt = receipt_dict(picked, model_spec=model_spec, file=os.path.basename(path))
    rpath = artefacts.receipt_path(path)
    with open(rpath + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(receipt, fh, indent=2)
    os.replace(rpath + ".tmp", rpath)
    return path, rpath


def receipt_dict(picked: Picked, *, model_spec: str, file: str) -> dict[str, Any]:
    win = picked.winner
    assert win is not None
    second = picked.runner_up()
    return {
        "format": artefacts.RECEIPT_FORMAT,
        "model": model_spec,
        "input_shapes": [list(picked.input_shape)],
        "threads": picked.threads,
        "precision": picked.precision,
        "min_sqnr_db": picked.min_sqnr_db,
        "rounds": picked.rounds,
        "checked_on": f"{picked.held_out} held-out inputs",
        "calibrated_on": picked.calibrated_on,
        "winner": {**win.as_dict(), "file": file},
        "runner_up": second.as_dict() if second else None,
        "load": f"import pytorchtricks as ptt; m = ptt.load_artefact({file!r}); y = m(x)",
        "rows": [r.as_dict() for r in picked.rows],
        "environment": picked.environment,
    }


def summary(picked: Picked) -> str:
    """One line: which engine won, by how much over eager fp32 and over the runner-up."""
    win = picked.winner
    if win is None:
        return "no candidate met the bound: keep the model as it is (each row says why)"
    text = f"winner: {win.name} ({win.median_ms:.2f} ms, {win.speedup:.2f}x eager fp32"
    second = picked.runner_up()
    if second is not None and second.median_ms:
        text += f", {second.median_ms / (win.median_ms or math.inf):.2f}x the runner-up {second.name}"
    return text + f"; SQNR {win.sqnr_db:.1f} dB)"
