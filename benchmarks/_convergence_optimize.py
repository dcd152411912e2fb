"""Part 3 of the convergence benchmark: the trained detector through ``ptt optimize``'s picker, each artefact's mAP.

torchvision's FCOS returns a list of dicts after box decoding and NMS, which no engine takes; what the engines take
is the tensor part (``TensorPart``): backbone + FPN + head on one fixed canvas (``CANVAS`` x ``CANVAS``: the model's
own transform output - normalised, resized, padded to 32 - padded with zeros to it), returning the head's three
tensors. The anchors, the box decoding, NMS and the resize back stay eager (``FCOS.anchor_generator``,
``FCOS.postprocess_detections``, ``transform.postprocess``: ``FCOS.forward``'s own steps), the same code for every
artefact (``Detector``). Every row is scored by ``convergence.evaluate`` - the exact COCOeval the training runs were
scored with - on the val pixels of the ``ptt`` pipeline (``--pipeline``).

The artefacts come from ``pytorchtricks.infer.picker.pick_artefact`` (what ``ptt optimize`` runs) at
``precision="any"``: fp32 exported (as given, channels_last), ORT fp32, int8 (the PT2E program as a oneDNN plan, ORT
static int8) calibrated on train images of the same pipeline (no flip); the picker's SQNR check runs on other train
images. AOTInductor is left out by default (``--engines``; its compile takes minutes a candidate on 2 cores). Each
candidate's file, as the picker wrote it, is loaded back (``infer.artefacts.load``) and scored - also the ones the
picker refused for their SQNR (their mAP is what the refusal cost or saved). The picker's timings are not reported:
they were taken at 1 round on a shared machine.

    python benchmarks/_convergence_optimize.py --weights /tmp/ptt-bench-convergence/models/ptt-seed0.pt \
        --out results/amx/convergence
"""

from __future__ import annotations

import argparse
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


def canvas(model: Any, image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """The model's own transform (normalise, resize, pad to 32), then padded with zeros to the fixed canvas."""
    il, _ = model.transform([image])
    h, w = il.image_sizes[0]
    th, tw = il.tensors.shape[-2:]
    if th > CANVAS or tw > CANVAS:
        raise PttError(
            f"the model's transform made a {th}x{tw} batch, larger than the {CANVAS} px canvas; raise CANVAS "
            "(or --size smaller)."
        )
    x = torch.zeros(1, 3, CANVAS, CANVAS)
    x[:, :, :th, :tw] = il.tensors
    return x, (h, w)


class Detector:
    """FCOS's eval forward with the tensor part replaced by ``run`` (any engine): what ``convergence.evaluate``
    calls as a model (a list of float images in, a list of {boxes, scores, labels} out, one image a call to
    ``run``)."""

    def __init__(self, model: Any, run: Any) -> None:
        self.model, self.run = model, run
        with torch.no_grad():
            feats = model.backbone(torch.zeros(1, 3, CANVAS, CANVAS)).values()
        self.shapes = [(int(f.shape[-2]), int(f.shape[-1])) for f in feats]

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
        x, size = canvas(m, image)
        with torch.no_grad():
            outs = [torch.as_tensor(t).float() for t in self.run(x)]
            n = [h * w for h, w in self.shapes]  # FCOS: one anchor a location
            il = ImageList(x, [size])
            anchors = m.anchor_generator(il, [torch.empty(1, 1, h, w) for h, w in self.shapes])
            keys = ("cls_logits", "bbox_regression", "bbox_ctrness")
            head = {k: list(o.split(n, dim=1)) for k, o in zip(keys, outs, strict=True)}
            dets = m.postprocess_detections(head, [list(a.split(n)) for a in anchors], il.image_sizes)
            out = m.transform.postprocess(dets, il.image_sizes, [tuple(image.shape[-2:])])
        return out[0]  # type: ignore[no-any-return]


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
    """Every row for one trained model: eager fp32 (whole model, tensor part), then each picker candidate."""
    from pytorchtricks.infer import artefacts
    from pytorchtricks.infer.picker import parse_engines, pick_artefact

    name = os.path.basename(weights)
    model = build_detector(args.size)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    part = TensorPart(model).eval()
    base = {"model": name, "pipeline": args.pipeline}

    whole = evaluate(model, coco, args.pipeline, args.size)  # the training run's own score of this model
    model.eval()  # evaluate leaves it in training mode
    eager = evaluate(Detector(model, part), coco, args.pipeline, args.size)
    say(f"{name}: eager fp32 whole model {whole}, tensor part on the canvas {eager}")
    rows: list[dict[str, Any]] = [
        {**base, "name": "eager fp32, whole model (batches of 8, its own padding)", "engine": "eager",
         "precision": "fp32", "status": "ok", **whole},
        {**base, "name": "eager fp32, tensor part on the canvas", "engine": "eager", "precision": "fp32",
         "status": "ok", **eager},
    ]  # fmt: skip
    rows[0]["delta_map_points"] = round((whole["map"] - eager["map"]) * 100, 2)
    rows[1]["delta_map_points"] = 0.0

    calib_images = train_images(coco, args.pipeline, args.size, 0, args.calibration)
    check_images = train_images(coco, args.pipeline, args.size, args.calibration, args.check)
    calib = [canvas(model, im)[0] for im in calib_images]
    held = [canvas(model, im)[0] for im in check_images]
    with tempfile.TemporaryDirectory(prefix="ptt-conv-opt-") as tmp:
        picked = pick_artefact(
            part, calib[0], calibration=calib, held_out=held, precision="any",
            engines=parse_engines(args.engines), rounds=1, min_run_time_s=0.05, workdir=tmp, progress=say,
        )  # fmt: skip
        for r in picked.rows:
            if r.status == "baseline":
                continue  # the picker's own eager fp32: the rows above
            d = {k: v for k, v in r.as_dict().items() if not k.startswith(("median", "speedup", "build"))}
            row: dict[str, Any] = {**base, **d, "map": None, "map50": None, "delta_map_points": None}
            if r.path:  # built and loaded back by the picker (ok, or refused for its SQNR): score its file
                try:
                    fn = artefacts.load(r.kind, r.path, input_shapes=[(1, 3, CANVAS, CANVAS)])
                    m = evaluate(Detector(model, fn), coco, args.pipeline, args.size)
                    row.update(m, delta_map_points=round((m["map"] - eager["map"]) * 100, 2))
                except Exception as exc:  # recorded in its row: the other artefacts are still scored
                    row["status"] += (
                        f"; not scored: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
                    )
            say(f"{name}: {r.name}: {row['status']}, SQNR {row.get('sqnr_db')}, mAP {row['map']}")
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from pytorchtricks.hardware import cpu_caps

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--weights", nargs="+", required=True, help="state_dicts convergence.py saved (WORK/models/*.pt)"
    )
    ap.add_argument("--work", default="/tmp/ptt-bench-convergence", help="convergence.py's --work (the set)")
    ap.add_argument(
        "--pipeline", default="ptt", choices=("ptt", "ref"), help="whose val pixels score the models"
    )
    ap.add_argument("--size", type=int, default=128, help="the models' short side (convergence.py's --size)")
    ap.add_argument("--calibration", type=int, default=32, help="train images that calibrate int8")
    ap.add_argument("--check", type=int, default=8, help="other train images the picker's SQNR check runs on")
    ap.add_argument("--engines", default="eager,onednn,ort", help="the picker's engines (aoti: minutes each)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class, "convergence"))
    args = ap.parse_args(argv)

    from pytorchtricks.clock import environment, write_results

    coco = os.path.join(args.work, "set", "coco")
    if not os.path.isdir(coco):
        raise PttError(f"no detection set at {coco}: run make bench-convergence first (or give its --work).")
    for w in args.weights:
        if not os.path.isfile(w):
            raise PttError(
                f"{w} does not exist: make bench-convergence writes WORK/models/<pipeline>-seed<n>.pt."
            )
    env = environment()
    env.update(weights=args.weights, set_params=SET_PARAMS, canvas=CANVAS, pipeline=args.pipeline)
    stem = os.path.join(args.out, "optimize")
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
        f"optimize` runs; precision `any`, engines `{args.engines}`; AOTInductor left out: minutes of compile a "
        f"candidate on 2 cores) rewrote the fp32 model first (Conv-BN folding), calibrated int8 on "
        f"{args.calibration} train images and checked each file's SQNR vs eager fp32 on {args.check} other train "
        "images. Each candidate's file, as written, was loaded back and scored - also those refused for their SQNR.",
        "",
        "mAP difference in points (x100) against *eager fp32, tensor part on the canvas* (the same decoding and "
        "canvas as every artefact). The whole-model row is the model as convergence.py scored it (batches of 8, "
        "each padded to its own largest image): its difference from the canvas row is what the fixed canvas "
        "changes (the padding the convolutions see at the right and bottom edges, and the P6/P7 strides "
        "torchvision derives from the padded size).",
        "",
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
    return "\n".join(out) + "\n"


def _eager(rows: list[dict[str, Any]], model: str) -> dict[str, Any]:
    return next(
        r for r in rows if r["model"] == model and r["name"] == "eager fp32, tensor part on the canvas"
    )


if __name__ == "__main__":
    sys.exit(main())
