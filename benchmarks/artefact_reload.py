"""Does the file `ptt optimize` hands back keep its speed in a fresh process, without the model's code?

For each batch and thread count this runs the real command, ``ptt optimize torchvision:resnet18 --input-shape
B,3,160,160 --precision any --threads T --out DIR/m``, reads the receipt (``m.json``: the winner and the speed-up
the picker measured), then times three things interleaved (rotated order, one ``clock.measure`` block of each
per round): eager fp32 ResNet-18 (the baseline, in this process), the artefact loaded here with
``ptt.load_artefact``, and the artefact loaded by ``ptt.load_artefact`` in a **fresh Python process** that imports
only torch and pytorchtricks (it reports whether torchvision got imported) and times a block whenever this one
asks. The fresh process's speed-up vs eager fp32 is set beside the receipt's.

    make bench-artefact-reload      # writes results/<cpu class>/artefact_reload.{jsonl,md}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

from pytorchtricks.clock import environment, measure, publish, quantiles
from pytorchtricks.hardware import cpu_caps

PX = 160
# The fresh process: load the artefact, then time one block per "t" line on stdin and print its median seconds.
WORKER = r"""
import json, sys
import torch
import pytorchtricks as ptt
from pytorchtricks.clock import measure
path, threads, shape = sys.argv[1], int(sys.argv[2]), tuple(json.loads(sys.argv[3]))
torch.set_num_threads(threads)
m = ptt.load_artefact(path, threads=threads)
x = torch.randn(*shape)
with torch.no_grad():
    for _ in range(3):
        m(x)
print(json.dumps({"ready": True, "torchvision_imported": "torchvision" in sys.modules}), flush=True)
for line in sys.stdin:
    if line.strip() != "t":
        break
    with torch.no_grad():
        s = measure(lambda: m(x), min_run_time_s=float(sys.argv[4]), warmup=1)
    print(json.dumps({"median_s": s.median_s}), flush=True)
"""


class FreshProcess:
    """The artefact loaded in a child process; ``block()`` times one block there and returns its median seconds."""

    def __init__(self, path: str, threads: int, shape: tuple[int, ...], block_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, path, str(threads), json.dumps(list(shape)), str(block_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(self._read())
        self.torchvision_imported = bool(hello["torchvision_imported"])

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the fresh process exited (rc {self.proc.poll()})")
        return line

    def block(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("t\n")
        self.proc.stdin.flush()
        return float(json.loads(self._read())["median_s"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def interleave(
    eager: Any, here: Any, fresh: FreshProcess, x: torch.Tensor, rounds: int, block_s: float
) -> dict[str, list[float]]:
    """Per-call median seconds of one block of each per round, in rotated order (``clock.measure`` blocks here,
    the fresh process's own ``clock.measure`` blocks there)."""

    def in_process(model: Any) -> float:
        with torch.no_grad():
            return measure(lambda: model(x), min_run_time_s=block_s, warmup=1).median_s

    blocks = {"eager": lambda: in_process(eager), "here": lambda: in_process(here), "fresh": fresh.block}
    times: dict[str, list[float]] = {k: [] for k in blocks}
    names = list(blocks)
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            time.sleep(0.2)  # the other process's OpenMP threads stop spinning before a timed block
            times[name].append(blocks[name]())
    return times


def optimize(batch: int, threads: int, out: str) -> dict[str, Any]:
    """Run the real command; return its receipt."""
    cmd = [sys.executable, "-m", "pytorchtricks", "optimize", "torchvision:resnet18", "--input-shape",
           f"{batch},3,{PX},{PX}", "--precision", "any", "--threads", str(threads), "--rounds", "3", "--out", out]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out + ".json", encoding="utf-8") as fh:
        return dict(json.load(fh))


def run(batches: list[int], threads: list[int], rounds: int, block_s: float) -> list[dict[str, Any]]:
    import torchvision

    import pytorchtricks as ptt

    env, rows = environment("cpu"), []
    for batch in batches:
        for t in threads:
            folder = tempfile.mkdtemp(prefix=f"ptt-reload-b{batch}-t{t}-")
            receipt = optimize(batch, t, os.path.join(folder, "m"))
            win = receipt["winner"]
            path = os.path.join(folder, win["file"])
            torch.set_num_threads(t)
            torch.manual_seed(0)
            eager = torchvision.models.resnet18(weights=None).eval()
            here = ptt.load_artefact(path, threads=t)
            x = torch.randn(batch, 3, PX, PX)
            fresh = FreshProcess(path, t, tuple(x.shape), block_s)

            try:
                times = interleave(eager, here, fresh, x, rounds, block_s)
            finally:
                fresh.close()
            speedups = {k: [e / v for e, v in zip(times["eager"], times[k])] for k in ("here", "fresh")}
            q = {k: quantiles(v) for k, v in speedups.items()}
            rows.append({"kind": "bench", "benchmark": "artefact_reload", "batch": batch, "threads": t,
                         "winner": win["name"], "file": win["file"], "rounds": rounds,
                         "receipt_speedup": win["speedup"], "receipt_speedup_q1": win["speedup_q1"],
                         "receipt_speedup_q3": win["speedup_q3"],
                         **{f"{k}_speedup": q[k][1] for k in q}, **{f"{k}_speedup_q1": q[k][0] for k in q},
                         **{f"{k}_speedup_q3": q[k][2] for k in q},
                         **{f"{k}_median_s": quantiles(v)[1] for k, v in times.items()},
                         "fresh_torchvision_imported": fresh.torchvision_imported,
                         "env": {**env, "threads": t}})  # fmt: skip
            print(f"batch {batch} threads {t}: {win['name']} done", flush=True)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    env = rows[0]["env"] if rows else {}
    out = [
        "# The artefact `ptt optimize` hands back, in a fresh process: ResNet-18, 160 px, `--precision any`",
        "",
        f"{env.get('cpu')} ({cpu_caps().cpu_class}; flags {', '.join(env.get('cpu_flags', []))}), torch "
        f"{env.get('torch')}, {env.get('cpu_count')} cores. Speed-up = eager fp32 median / artefact median. "
        "'receipt': what the picker measured (its interleaved rounds, IQR); 'this process': the file loaded with "
        "`ptt.load_artefact` here; 'fresh process': the file loaded by "
        "`ptt.load_artefact` in a new Python process that imports torch and pytorchtricks only, timed there when "
        "this process asks. This process and the fresh one: paired per round with eager fp32 (median, IQR) over "
        f"{rows[0]['rounds'] if rows else '?'} interleaved rounds in rotated order.",
        "",
        "| batch | threads | winner | receipt | this process | fresh process | fresh ms | torchvision in the fresh process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['batch']} | {r['threads']} | {r['winner']} (`{r['file']}`) | "
            f"{r['receipt_speedup']:.2f}x ({r['receipt_speedup_q1']:.2f}-{r['receipt_speedup_q3']:.2f}) | "
            f"{r['here_speedup']:.2f}x ({r['here_speedup_q1']:.2f}-{r['here_speedup_q3']:.2f}) | "
            f"{r['fresh_speedup']:.2f}x ({r['fresh_speedup_q1']:.2f}-{r['fresh_speedup_q3']:.2f}) | "
            f"{r['fresh_median_s'] * 1e3:.2f} | {'imported' if r['fresh_torchvision_imported'] else 'not imported'} |"
        )
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block-s", type=float, default=0.3, help="seconds per timed block")
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class, "artefact_reload"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = run(args.batches, args.threads, args.rounds, args.block_s)
    return publish(args.out, rows, to_markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
