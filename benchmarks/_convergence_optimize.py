"""Part 3 of the convergence benchmark: the trained detector through ``ptt optimize``'s picker, each artefact's mAP.

torchvision's FCOS returns a list of dicts after box decoding and NMS, which no engine takes; what the engines take
is the tensor part (``TensorPart``): backbone + FPN + head on one fixed canvas (``CANVAS`` x ``CANVAS``: the model's
own transform output - normalised, resized, padded to 32 - padded with zeros to it), returning the head's three
tensors. The anchors, the box decoding, NMS and the resize back stay eager (``FCOS.anchor_generator``,
``FCOS.postprocess_detections``, ``transform.postprocess``: ``FCOS.forward``'s own steps), the same code for every
artefact (``Detector``). Every row is scored by ``convergence.evaluate`` - the exact COCOeval the training runs were
scored with - on the val pixels of the ``ptt`` pipeline (``--pipeline``). Before any artefact, eager fp32 is scored
four ways: the whole model in convergence.py's batches of 8, the whole model at batch 1, the tensor part + the eager
decoding at batch 1 on the same padding (must equal the previous row: the wrapper check), and on the canvas (the
artefacts' baseline; a canvas per orientation too, eager only).

The artefacts come from ``pytorchtricks.infer.picker.pick_artefact`` (what ``ptt optimize`` runs) at
``precision="any"`` (``--precision``): fp32 exported (as given, channels_last), ORT fp32, int8 (the PT2E program as a oneDNN plan, ORT
static int8) calibrated on train images of the same pipeline (no flip); the picker's SQNR check runs on other train
images. AOTInductor is left out by default (``--engines``; its compile takes minutes a candidate on 2 cores). Each
candidate's file, as the picker wrote it, is loaded back (``infer.artefacts.load``) and scored - also the ones the
picker refused for their SQNR (their mAP is what the refusal cost or saved). Then the int8 candidates again on the
head unrolled per level (``UnrolledPart``; ``--no-unrolled`` skips it). The picker's timings are not reported: they
were taken at 1 round on a shared machine.

    python benchmarks/_convergence_optimize.py --weights /tmp/ptt-bench-convergence/models/ptt-seed0.pt \
        --out results/amx/convergence
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from typing import Any

import torch
from convergence import ROOT, SET_PARAMS, build_detector, evaluate

from pytorchtricks.core import PttError

CANVAS = 192  # short side 128, long side <= 170 (4/3 of it), padded to 32: every image of the set fits


class TensorPart(torch.nn.Module):
    """backbone + head of a torchvision FCOS: a normalised, padded batch -> (cls_logits, bbox_regression, ctrness)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.backbone, self.head = model.backbone, model.head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.head(list(self.backbone(x).values()))
        return out["cls_logits"], out["bbox_regression"], out["bbox_ctrness"]


def canvas(
    model: Any, image: torch.Tensor, orientation: bool = False
) -> tuple[torch.Tensor, tuple[int, int]]:
    """The model's own transform (normalise, resize, pad to 32), then padded with zeros to the fixed canvas
    (``orientation``: to ``short x CANVAS`` for a landscape image, ``CANVAS x short`` for a portrait one, short =
    the model's short side padded to 32)."""
    il, _ = model.transform([image])
    h, w = il.image_sizes[0]
    th, tw = il.tensors.shape[-2:]
    ch = cw = CANVAS
    if orientation:
        short = -(-int(model.transform.min_size[0]) // 32) * 32
        ch, cw = (short, CANVAS) if tw >= th else (CANVAS, short)
    if th > ch or tw > cw:
        raise PttError(
            f"the model's transform made a {th}x{tw} batch, larger than the {ch}x{cw} canvas; raise CANVAS "
            "(or --size smaller)."
        )
    x = torch.zeros(1, 3, ch, cw)
    x[:, :, :th, :tw] = il.tensors
    return x, (h, w)


class Detector:
    """FCOS's eval forward with the tensor part replaced by ``run`` (any engine): what ``convergence.evaluate``
    calls as a model (a list of float images in, a list of {boxes, scores, labels} out, one image a call to
    ``run``). ``pad="own"``: each image on its own transform output (padded to 32, no canvas) - the check that
    this decoding is FCOS's (it must give ``WholeModel``'s detections exactly); ``"orientation"``: a canvas for
    landscape and one for portrait images (eager only: what two fixed-shape artefacts would see)."""

    def __init__(self, model: Any, run: Any, pad: str = "canvas") -> None:
        self.model, self.run, self.pad = model, run, pad
        self._shapes: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def shapes(self, hw: tuple[int, int]) -> list[tuple[int, int]]:
        """Each pyramid level's (h, w) for an input of ``hw`` (one backbone pass on zeros, cached)."""
        if hw not in self._shapes:
            with torch.no_grad():
                feats = self.model.backbone(torch.zeros(1, 3, *hw)).values()
            self._shapes[hw] = [(int(f.shape[-2]), int(f.shape[-1])) for f in feats]
        return self._shapes[hw]

    def eval(self) -> Detector:
        self.model.eval()
        return self

    def train(self, mode: bool = True) -> Detector:
        return self  # convergence.evaluate puts its model back in training mode: this one stays in eval

    def __call__(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [self.one(image) for image in images]

    def one(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        from torchvision.models.detection.image_list import ImageList

        m = self.model
        if self.pad in ("canvas", "orientation"):
            x, size = canvas(m, image, self.pad == "orientation")
        else:
            il0, _ = m.transform([image])
            x, size = il0.tensors, il0.image_sizes[0]
        shapes = self.shapes((int(x.shape[-2]), int(x.shape[-1])))
        with torch.no_grad():
            outs = [torch.as_tensor(t).float() for t in self.run(x)]
            n = [h * w for h, w in shapes]  # FCOS: one anchor a location
            il = ImageList(x, [size])
            anchors = m.anchor_generator(il, [torch.empty(1, 1, h, w) for h, w in shapes])
            keys = ("cls_logits", "bbox_regression", "bbox_ctrness")
            head = {k: list(o.split(n, dim=1)) for k, o in zip(keys, outs, strict=True)}
            dets = m.postprocess_detections(head, [list(a.split(n)) for a in anchors], il.image_sizes)
            out = m.transform.postprocess(dets, il.image_sizes, [tuple(image.shape[-2:])])
        return out[0]  # type: ignore[no-any-return]


class WholeModel:
    """The model itself, one image a call (batch 1: each image padded to 32 on its own, no batch padding)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def eval(self) -> WholeModel:
        self.model.eval()
        return self

    def train(self, mode: bool = True) -> WholeModel:
        return self

    def __call__(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        with torch.no_grad():
            return [self.model([image])[0] for image in images]


class UnrolledPart(torch.nn.Module):
    """``TensorPart`` with the head copied once a pyramid level (the same weights, not shared): the same function;
    a graph in which no weight feeds two convolutions (ONNX Runtime's static int8 quantizer refuses shared ones)."""

    def __init__(self, model: Any, levels: int) -> None:
        super().__init__()
        self.backbone = model.backbone
        self.heads = torch.nn.ModuleList(copy.deepcopy(model.head) for _ in range(levels))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outs = [h([f]) for h, f in zip(self.heads, self.backbone(x).values(), strict=True)]
        keys = ("cls_logits", "bbox_regression", "bbox_ctrness")
        return tuple(torch.cat([o[k] for o in outs], dim=1) for k in keys)  # type: ignore[return-value]


def train_images(coco: str, pipeline: str, size: int, start: int, count: int) -> list[torch.Tensor]:
    """``count`` train images from ``start`` as ``pipeline``'s eval path makes them (``convergence._val_batches``'s
    code over the train split: no flip): what calibrates int8 and what the picker checks on."""
    import convergence

    import pytorchtricks as ptt

    if pipeline == "ref":
        ds = convergence._reference_dataset(coco, "train", False)
        return [ds[i][0] for i in range(start, start + count)]
    recipe = ptt.DetectionRecipe.shortest_side(size, size * 4 // 3, flip=0.0)
    cfg = ptt.DetectionLoaderConfig(num_workers=0, shuffle=False, drop_last=False, group_by_aspect=False)
    out: list[torch.Tensor] = []
    for b in ptt.make_detection_loader(ptt.open_detection(coco, split="train"), 8, recipe, cfg):
        hw = [(int(h), int(w)) for h, w in b.sizes.tolist()]
        out += [b.images[i, :, :h, :w].float().div_(255) for i, (h, w) in enumerate(hw)]
        if len(out) >= start + count:
            break
    return out[start : start + count]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def one_model(weights: str, args: Any, coco: str) -> list[dict[str, Any]]:
    """Every row for one trained model: eager fp32 (whole model; tensor part on its own padding, then on the
    canvas), each candidate of the picker on the tensor part, then the int8 candidates on the head unrolled."""
    from pytorchtricks.infer.picker import parse_engines

    name = os.path.basename(weights)
    model = build_detector(args.size)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    part = TensorPart(model).eval()
    base = {"model": name, "pipeline": args.pipeline, "engine": "eager", "precision": "fp32", "status": "ok"}

    def score(runner: Any) -> dict[str, float]:
        m = evaluate(runner, coco, args.pipeline, args.size)
        model.eval()  # evaluate leaves its model in training mode
        return m

    eager_rows = [
        ("eager fp32, whole model (batches of 8: convergence.py's score)", model),
        ("eager fp32, whole model, batch 1 (each image padded to 32)", WholeModel(model)),
        (
            "eager fp32, tensor part + eager decoding, batch 1 (each image padded to 32)",
            Detector(model, part, "own"),
        ),
        (EAGER_ORIENTATION, Detector(model, part, "orientation")),
        (EAGER_CANVAS, Detector(model, part)),
    ]
    rows: list[dict[str, Any]] = []
    for label, runner in eager_rows:
        rows.append({**base, "name": label, **score(runner)})
        say(f"{name}: {label}: mAP {rows[-1]['map']:.4f}, mAP50 {rows[-1]['map50']:.4f}")
    eager = next(r for r in rows if r["name"] == EAGER_CANVAS)
    for r in rows:
        r["delta_map_points"] = round((r["map"] - eager["map"]) * 100, 2)

    calib_images = train_images(coco, args.pipeline, args.size, 0, args.calibration)
    check_images = train_images(coco, args.pipeline, args.size, args.calibration, args.check)
    calib = [canvas(model, im)[0] for im in calib_images]
    held = [canvas(model, im)[0] for im in check_images]
    engines = parse_engines(args.engines)
    rows += picker_rows(
        part, "", args.precision, engines, calib, held, model, score, eager, {**base, "model": name}
    )
    int8_engines = tuple(e for e in engines if e in ("onednn", "ort", "aoti"))
    if args.unrolled and int8_engines:
        unrolled = UnrolledPart(model, len(Detector(model, part).shapes((CANVAS, CANVAS)))).eval()
        rows += picker_rows(
            unrolled, " (head unrolled per level)", "int8", int8_engines, calib, held, model, score, eager,
            {**base, "model": name},
        )  # fmt: skip
    return rows


EAGER_CANVAS = "eager fp32, tensor part + eager decoding, on the canvas"
EAGER_ORIENTATION = (
    f"eager fp32, tensor part + eager decoding, batch 1, on a canvas per orientation ({CANVAS} px long side)"
)


def picker_rows(
    part: Any,
    suffix: str,
    precision: str,
    engines: Any,
    calib: list[torch.Tensor],
    held: list[torch.Tensor],
    model: Any,
    score: Any,
    eager: dict[str, Any],
    base: dict[str, Any],
) -> list[dict[str, Any]]:
    """``pick_artefact`` on ``part``; each candidate it wrote, loaded back and scored on the canvas."""
    from pytorchtricks.infer import artefacts
    from pytorchtricks.infer.picker import pick_artefact

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ptt-conv-opt-") as tmp:
        picked = pick_artefact(
            part, calib[0], calibration=calib, held_out=held, precision=precision, engines=engines,
            rounds=1, min_run_time_s=0.05, workdir=tmp, progress=say,
        )  # fmt: skip
        for r in picked.rows:
            if r.status == "baseline":
                continue  # the picker's own eager fp32: the rows above
            d = {k: v for k, v in r.as_dict().items() if not k.startswith(("median", "speedup", "build"))}
            row: dict[str, Any] = {**base, **d, "map": None, "map50": None, "delta_map_points": None}
            row["name"] = r.name + suffix
            if r.path:  # built and loaded back by the picker (ok, or refused for its SQNR): score its file
                try:
                    fn = artefacts.load(r.kind, r.path, input_shapes=[(1, 3, CANVAS, CANVAS)])
                    m = score(Detector(model, fn))
                    row.update(m, delta_map_points=round((m["map"] - eager["map"]) * 100, 2))
                except Exception as exc:  # recorded in its row: the other artefacts are still scored
                    why = (str(exc).splitlines() or [""])[0][:200]
                    row["status"] += f"; not scored: {type(exc).__name__}: {why}"
            say(
                f"{base['model']}: {row['name']}: {row['status']}, SQNR {row.get('sqnr_db')}, mAP {row['map']}"
            )
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from pytorchtricks.hardware import cpu_caps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--weights", nargs="+", default=[], help="state_dicts convergence.py saved (WORK/models/*.pt)"
    )
    ap.add_argument("--work", default="/tmp/ptt-bench-convergence", help="convergence.py's --work (the set)")
    ap.add_argument(
        "--pipeline", default="ptt", choices=("ptt", "ref"), help="whose val pixels score the models"
    )
    ap.add_argument("--size", type=int, default=128, help="the models' short side (convergence.py's --size)")
    ap.add_argument("--calibration", type=int, default=32, help="train images that calibrate int8")
    ap.add_argument("--check", type=int, default=8, help="other train images the picker's SQNR check runs on")
    ap.add_argument("--engines", default="eager,onednn,ort", help="the picker's engines (aoti: minutes each)")
    ap.add_argument(
        "--no-unrolled", dest="unrolled", action="store_false",
        help="skip the int8 candidates on the head unrolled per level (no shared weights)",
    )  # fmt: skip
    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class, "convergence"))
    ap.add_argument("--precision", default="any", help="the picker's precision on the tensor part")
    ap.add_argument("--stem", default="optimize", help="the results' file name in OUT (STEM.md, STEM.jsonl)")
    ap.add_argument("--page-only", action="store_true", help="rewrite optimize.md from OUT/optimize.jsonl")
    args = ap.parse_args(argv)

    from pytorchtricks.clock import environment, write_results

    if args.page_only:  # the page from the rows a run wrote (its env, its weights), nothing rerun
        with open(os.path.join(args.out, args.stem + ".jsonl"), encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        env = rows[0]["env"]
        args.weights = list(env["weights"])
        for k in ("engines", "calibration", "check", "size", "pipeline", "precision"):
            setattr(args, k, env.get(k, getattr(args, k)))
        page = markdown(rows, env, args, args.weights)
        write_results(os.path.join(args.out, args.stem), rows, page)
        print(page)
        return 0

    coco = os.path.join(args.work, "set", "coco")
    if not os.path.isdir(coco):
        raise PttError(f"no detection set at {coco}: run make bench-convergence first (or give its --work).")
    if not args.weights:
        raise PttError(
            "give --weights WORK/models/<pipeline>-seed<n>.pt ... (the models bench-convergence trained)."
        )
    for w in args.weights:
        if not os.path.isfile(w):
            raise PttError(
                f"{w} does not exist: make bench-convergence writes WORK/models/<pipeline>-seed<n>.pt."
            )
    env = environment()
    env.update(weights=args.weights, set_params=SET_PARAMS, canvas=CANVAS, pipeline=args.pipeline)
    env.update(engines=args.engines, calibration=args.calibration, check=args.check, size=args.size)
    env.update(precision=args.precision)
    stem = os.path.join(args.out, args.stem)
    rows: list[dict[str, Any]] = []
    page = ""
    for i, w in enumerate(args.weights):
        rows += one_model(w, args, coco)
        page = markdown(rows, env, args, args.weights[: i + 1])
        write_results(
            stem, [{**x, "env": env} for x in rows], page
        )  # after each model: a cut run keeps these
    print(page)
    return 0


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], args: Any, weights: list[str]) -> str:
    out = [
        "# The trained detector through ptt optimize's picker: each artefact's mAP",
        "",
        f"{env.get('cpu')} (class `{env.get('cpu_class')}`), {env.get('threads')} threads, torch {env.get('torch')}, "
        f"{env.get('time_utc')}, git {env.get('git_sha')}. `make bench-convergence-optimize` "
        "(benchmarks/_convergence_optimize.py). Accuracy only: no timing is reported (the picker timed its "
        "candidates at 1 round on a machine shared with other work; those numbers are not a measurement).",
        "",
        f"Models: {', '.join(f'`{w}`' for w in weights)} (FCOS trained from scratch by convergence.py). "
        f"Scored by convergence.py's own `evaluate` (pycocotools COCOeval bbox, mAP@[.5:.95] and mAP50) on the "
        f"{SET_PARAMS['val']} val images as the `{args.pipeline}` pipeline makes them (short side {args.size}). "
        f"The engines take the tensor part (backbone + FPN + head, batch 1, on a fixed {CANVAS}x{CANVAS} canvas: "
        "the model's transform output padded with zeros); anchors, box decoding, NMS and the resize back stay "
        "eager (torchvision's FCOS code), the same for every row. The picker (`pick_artefact`, what `ptt "
        f"optimize` runs; precision `{args.precision}`, engines `{args.engines}`"
        f"{'' if 'aoti' in args.engines else '; AOTInductor left out: minutes of compile a candidate on 2 cores'}) "
        "rewrote the fp32 model first (Conv-BN folding), calibrated int8 on "
        f"{args.calibration} train images and checked each file's SQNR vs eager fp32 on {args.check} other train "
        "images. Each candidate's file, as written, was loaded back and scored - also those refused for their SQNR.",
        "",
        f"mAP difference in points (x100) against *{EAGER_CANVAS}* (the same decoding and canvas as every "
        "artefact). The eager rows above it check the wrapper: *whole model, batch 1* and *tensor part + eager "
        "decoding, batch 1* see the same pixels and padding, so their mAPs must be equal (if not, the wrapper is "
        "not FCOS's forward); *whole model (batches of 8)* is the model as convergence.py scored it, each batch "
        "padded to its largest image. The differences between them and the canvas row are what the padding "
        "changes: the zeros the convolutions see at the right and bottom edges, and the P6/P7 anchor strides "
        "torchvision derives from the padded size (a 192 px side has a 2-cell P7: stride 96, not 128)."
        + (
            " The *canvas per orientation* row (eager only) is what two fixed-shape artefacts, one for landscape "
            "and one for portrait images, would see."
            if any(r["name"] == EAGER_ORIENTATION for r in rows)
            else ""
        ),
        "",
        *(
            [
                "The picker ran twice a model: on the tensor part as it is (what `ptt optimize` gets), and with "
                "precision int8 on the same function with the head copied once a pyramid level (*head unrolled "
                "per level*: the same weights, none shared between convolutions), which the int8 builders may "
                "take where the first refused.",
                "",
            ]
            if any("unrolled" in r["name"] for r in rows)
            else []
        ),
        "| model | artefact | engine | precision | status | SQNR dB vs eager | mAP | mAP50 | mAP vs eager fp32, points |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r.get("delta_map_points")
        out.append(
            f"| {r['model']} | {r['name']} | {r.get('engine', '-')} | {r.get('precision', '-')} | {r['status']} | "
            f"{_f(r.get('sqnr_db'), '.1f')} | {_f(r['map'])} | {_f(r['map50'])} | {_f(d, '+.2f')} |"
        )
    out += ["", "## Acceptance (issue 48 part 3)", ""]
    out += ["Optimized fp32 artefacts within 0.5 mAP points of eager fp32; the int8 drop stated.", ""]
    for r in rows:
        if r["name"].startswith("eager fp32,"):
            continue
        d = r.get("delta_map_points")
        if d is None:
            out.append(f"- {r['model']}, {r['name']}: not built - {r['status']}")
        elif r.get("precision") == "fp32":
            verdict = "PASS" if abs(d) <= 0.5 else "FAIL"
            out.append(
                f"- {r['model']}, {r['name']}: {d:+.2f} mAP points vs eager fp32 -> {verdict} (within 0.5)"
            )
        else:
            out.append(
                f"- {r['model']}, {r['name']}: {r.get('precision')} changes mAP by {d:+.2f} points "
                f"(mAP50 {100 * (r['map50'] - _eager(rows, r['model'])['map50']):+.2f} points); SQNR "
                f"{_f(r.get('sqnr_db'), '.1f')} dB; picker: {r['status']}"
            )
    int8 = [r for r in rows if r.get("precision") == "int8"]
    if int8 and all(r.get("map") is None for r in int8):
        out += [
            "",
            f"No int8 candidate was built ({len(int8)} tried): the int8 drop on this detector could not be measured "
            "through the picker here; each line above says why.",
        ]
    if "aoti" not in args.engines and args.precision in ("int8", "any"):
        out += [
            "",
            "AOTInductor's int8 candidate (the same PT2E int8 program, compiled) was not in this run (`--engines`): "
            "`--engines aoti --precision int8 --no-unrolled --stem optimize-aoti-int8` runs it alone "
            "(`make bench-convergence-optimize` does).",
        ]
    return "\n".join(out) + "\n"


def _eager(rows: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return next(r for r in rows if r["model"] == model and r["name"] == EAGER_CANVAS)


if __name__ == "__main__":
    sys.exit(main())
