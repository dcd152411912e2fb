"""Stock Ultralytics YOLO vs with ptt (issue 47 part 5): the 2-24 MP wallpaper photos through Ultralytics 8.4.190's
own dataset, augmentations, loader and trainer, as installed and after ``ptt.ultralytics.accelerate`` (from the
original files, and from a ``ptt pack`` written for imgsz).

Parts (each one timed run under the benchmark lock; ``make bench-ultralytics`` runs them in turn):

- ``load``: bytes to an image at imgsz (``load_image``), imgsz 640 and 1280, one thread, each photo cold;
  images/s over all photos and over those of >= 8 MP; the pack's PSNR against the stock load.
- ``pipeline``: images/s through its dataset and loader (mosaic on, batch 16, 2 workers, cache none and ram), and
  where a sample's time goes (load, mosaic, affine, HSV, ...), measured without workers.
- ``first-batch``: time to the first batch at 100K images (links to the photos and their labels under /tmp): its
  first-run label scan, the run with its labels cache, the pack's index.
- ``epoch``: the CPU training epoch (its trainer, yolov8n from YAML, imgsz 640 and 320), and the epoch beside a
  declared accelerator step (``--device-step-ms``, the projection ``ptt tune`` makes: a stand-in step that holds the
  process without using a core).
- ``ram``: cache='ram' under torchrun with 2 ranks (2 workers each): USS and PSS over ranks + workers.

Systems run in rotating order per round (interleaved), each in its own child process; ratios are per round against
``stock``. Results: ``--out`` (``results/<cpu class>/ultralytics``): one JSONL per part, README.md (the tables),
environment.json, command.txt. Only ``pytorchtricks.clock`` reads a clock.

    make ultralytics-env && make bench-ultralytics
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

import _ultralytics_report as ur  # benchmarks/ is on sys.path: these run as scripts
import _ultralytics_sets as sets
from _child import emit, run_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.abspath(__file__)
PARTS = ("load", "pipeline", "first-batch", "epoch", "ram")
SYSTEMS = ("stock", "ptt-files", "ptt-files-speed", "ptt-pack")
DEFAULT_SYSTEMS = {
    "load": SYSTEMS
}  # match='speed' only where it changes the number asked for: the load stage
BATCH, WORKERS = 16, 2


class Plan:
    """Where the sets and packs live, from the command line."""

    def __init__(self, args: argparse.Namespace) -> None:
        w, n = args.work, args.first_batch_images
        self.args = args
        self.photos1 = os.path.join(w, "photos-x1")  # each >= 2 MP photo once: load stage, trainer epoch
        self.photos = os.path.join(w, f"photos-x{args.copies}")  # larger than the mosaic buffer: the loader
        self.linked = os.path.join(w, f"linked-{n}")  # links to the photos and their labels
        self.small = os.path.join(w, "photos-x1-small640")  # the photos at 640: the source of the 100K pack
        self.linked_small = os.path.join(w, f"linked-{n}-small640")

    def yaml(self, root: str) -> str:
        return os.path.join(root, "data.yaml")

    def pack(self, root: str, imgsz: int) -> str:
        """The pack written for ``imgsz`` of ``root`` (the 100K root's pack: of its 640 px twin)."""
        name = os.path.basename(self.linked if root == self.linked_small else root)
        return os.path.join(self.args.work, "packs", f"{name}-{imgsz}")


def prepare(plan: Plan, parts: list[str]) -> None:
    """Build the sets (links) and the packs the parts need; nothing here is timed."""
    a = plan.args
    sets.photo_root(plan.photos1, 1)
    sets.photo_root(plan.photos, a.copies)
    need: list[tuple[str, int]] = []
    if "load" in parts:
        need += [(plan.photos1, s) for s in a.imgsz]
    if "pipeline" in parts or "ram" in parts or "epoch" in parts:
        need += [(plan.photos, s) for s in a.imgsz] + [(plan.photos1, s) for s in a.epoch_imgsz]
    if "first-batch" in parts:
        sets.linked_root(plan.linked, a.first_batch_images, plan.photos1)
        sets.shrunk_root(plan.small, plan.photos1, 640)
        sets.linked_root(plan.linked_small, a.first_batch_images, plan.small)
        need.append((plan.linked_small, 640))
    import _ultralytics_systems as us

    for root, s in dict.fromkeys(need):
        dst = plan.pack(root, s)
        man = os.path.join(dst, "manifest.json")
        if os.path.exists(man):
            with open(man) as fh:
                if "targets" not in json.load(fh).get("detection", {}):  # written before targets.npz
                    shutil.rmtree(dst)
        if not os.path.exists(man):
            print(f"packing {root} for imgsz {s} -> {dst}", flush=True)
            us.write_pack(root, dst, s)
        us.pack_yaml(plan.yaml(root), dst)


def _child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    return run_child([sys.executable, HERE, "--run-one", json.dumps(spec)], timeout_s, ROOT, error_chars=600)


def _ram_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return run_child([*cmd, HERE, "--ram-rank", json.dumps(spec)], timeout_s, ROOT, error_chars=600)


def cases(plan: Plan, part: str) -> list[tuple[str, dict[str, Any]]]:
    """``(label, spec)`` of every measurement of a part, one system each; a round runs them in rotating order."""
    a = plan.args
    base = {"batch": BATCH, "workers": WORKERS}
    out: list[tuple[str, dict[str, Any]]] = []
    systems = a.systems or DEFAULT_SYSTEMS.get(part, ("stock", "ptt-files", "ptt-pack"))
    for system in systems:
        if part == "load":
            for s in a.imgsz:
                spec = {"system": system, "yaml": plan.yaml(plan.photos1), "imgsz": s, "n": 10_000}
                out.append((f"imgsz {s}", {**spec, "pack": plan.pack(plan.photos1, s)}))
        elif part == "pipeline":
            for s, cache in [(s, None) for s in a.imgsz] + [(a.imgsz[0], "ram")]:
                spec = {**base, "system": system, "yaml": plan.yaml(plan.photos), "imgsz": s, "cache": cache}
                out.append(
                    (f"imgsz {s}, cache {cache or 'none'}", {**spec, "pack": plan.pack(plan.photos, s)})
                )
                out[-1][1]["split_n"] = a.split_images if cache is None else 0  # the split: without a cache
        elif part == "first-batch":
            spec = {**base, "system": system, "yaml": plan.yaml(plan.linked), "imgsz": 640}
            spec["pack"] = plan.pack(plan.linked, 640)
            if system == "stock":
                out.append(("first run: label scan", {**spec, "labels_cache": False}))
                out.append(("with its labels cache", {**spec, "labels_cache": True}))
            elif system == "ptt-pack":
                out.append(("first open: its index and targets read cold", {**spec, "labels_cache": False}))
                out.append(("opened again", {**spec, "labels_cache": True}))
        elif part == "epoch":
            for s in a.epoch_imgsz:
                spec = {**base, "system": system, "yaml": plan.yaml(plan.photos1), "imgsz": s, "mode": "cpu"}
                out.append((f"CPU epoch, imgsz {s}", {**spec, "pack": plan.pack(plan.photos1, s)}))
            spec = {**base, "system": system, "yaml": plan.yaml(plan.photos), "imgsz": a.imgsz[0]}
            spec.update(
                mode="declared", device_step_ms=a.device_step_ms, pack=plan.pack(plan.photos, a.imgsz[0])
            )
            out.append((f"declared {a.device_step_ms:g} ms step, imgsz {a.imgsz[0]}", spec))
        elif part == "ram":
            spec = {
                **base,
                "system": system,
                "yaml": plan.yaml(plan.photos),
                "imgsz": a.imgsz[0],
                "batches": 3,
            }
            out.append(
                (f"cache ram, 2 ranks, imgsz {a.imgsz[0]}", {**spec, "pack": plan.pack(plan.photos, 640)})
            )
    return out


def _integration_digest() -> str | None:
    import hashlib

    h = hashlib.sha256()
    folder = os.path.join(ROOT, "src", "pytorchtricks", "integrations")
    if not os.path.isdir(folder):
        return None
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


def run_part(plan: Plan, part: str) -> list[dict[str, Any]]:
    """Every case of ``part``, ``rounds`` times in rotating order; each row printed as it comes."""
    from pytorchtricks.clock import environment

    env = environment()
    env["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    env["integration_sha256"] = (
        _integration_digest()
    )  # the working tree's integration may be ahead of git_sha
    todo = cases(plan, part)
    rounds = 1 if part in ("first-batch", "ram") else plan.args.rounds
    if part in ("epoch", "pipeline"):
        rounds = max(
            1, min(rounds, 2)
        )  # minutes per round on 2 cores: two rounds at most keep a run near 10 min
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        k = r % len(todo)
        for label, spec in todo[k:] + todo[:k]:
            if part == "epoch" and spec["mode"] == "cpu" and r:
                continue  # the CPU epoch once (no bound: yolov8n's compute dominates it)
            spec["part"] = part
            print(f"[{part}] round {r + 1}/{rounds}: {spec['system']}, {label}", flush=True)
            res = (
                _ram_child(spec, plan.args.timeout_s) if part == "ram" else _child(spec, plan.args.timeout_s)
            )
            row = {"part": part, "round": r, "case": label, "system": spec["system"], "spec": spec, **res}
            print(json.dumps(row), flush=True)
            rows.append({**row, "env": env})
    return rows


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    import _ultralytics_parts as parts
    import _ultralytics_systems as us

    us.quiet()  # before anything reads the environment: offline, the integration's memos in the work folder
    if spec["part"] == "epoch":
        return parts.epoch_trainer(spec) if spec["mode"] == "cpu" else parts.epoch_declared(spec)
    return {"load": parts.load, "pipeline": parts.pipeline, "first-batch": parts.first_batch}[spec["part"]](
        spec
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--prepare", nargs="*", choices=PARTS, help="build the sets and packs these parts need")
    ap.add_argument("--part", choices=PARTS, help="run one part (under the lock) and write its JSONL")
    ap.add_argument("--report", action="store_true", help="write README.md from every part's JSONL")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--systems", nargs="+", choices=SYSTEMS, help="default: all for load, else all but -speed"
    )
    ap.add_argument("--imgsz", type=int, nargs="+", default=[640, 1280])
    ap.add_argument("--epoch-imgsz", type=int, nargs="+", default=[640, 320])
    ap.add_argument("--device-step-ms", type=float, default=60.0)
    ap.add_argument("--copies", type=int, default=6, help="links per photo in the loader's set")
    ap.add_argument("--split-images", type=int, default=32, help="samples timed for the stage split")
    ap.add_argument("--first-batch-images", type=int, default=100_000)
    ap.add_argument("--work", default="/tmp/ptt-ultra")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "amx", "ultralytics"))
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    ap.add_argument("--ram-rank", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        emit(run_one(json.loads(args.run_one)))
        return 0
    if args.ram_rank:
        import _ultralytics_parts as parts

        res = parts.ram_rank(json.loads(args.ram_rank))
        if res is not None:
            emit(res)
        return 0
    plan = Plan(args)
    if args.prepare is not None:
        prepare(plan, args.prepare or list(PARTS))
    if args.part:
        from pytorchtricks.clock import write_jsonl

        rows = run_part(plan, args.part)
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, args.part)
        if os.path.exists(stem + ".jsonl"):
            os.remove(stem + ".jsonl")
        write_jsonl(stem + ".jsonl", rows)
    if args.report:
        print(ur.write_report(args.out, vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
