"""`make demo` as a new user runs it, quiet and busy: the receipts and what each concluded (issue 29).

Runs `ptt tune` on its built-in workload (exactly what `make demo` runs) ``--quiet`` times on the machine as it is,
then once more while a CPU burner - another program, not a process of ours - spins on one core. Each receipt
(results.jsonl, report.html, apply.py) is kept under OUT/demo-<run>/, and OUT/demo.md sums them up: the diagnosis,
the recommendation and its verify-run ratio, the self-check, the busy share per phase, and whether the run said
"keep the current setup" (which a busy run must never present as a finding).

    python benchmarks/demo_receipts.py --out results/<cpu-class> [--quiet 2] [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys

BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def _burner(seconds: float) -> int:
    """A process spinning on one core for ``seconds``, started through a shell that exits at once: it is not a
    descendant of this script nor of the tune it runs beside."""
    out = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', BURN.format(s=seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def _tune(out: str, log: str) -> int:
    ptt = os.path.join(os.path.dirname(sys.executable), "ptt")
    with open(log, "w", encoding="utf-8") as fh:
        return subprocess.run([ptt, "tune", "--out", out], stdout=fh, stderr=subprocess.STDOUT).returncode


def _summary(name: str, folder: str) -> dict:
    with open(os.path.join(folder, "results.jsonl"), encoding="utf-8") as fh:
        rows = [json.loads(x) for x in fh]
    run = rows[0]
    diag = next((r for r in rows if r["kind"] == "tune-diagnosis"), {})
    summ = rows[-1]
    combined = summ.get("combined") or {}
    sc = run.get("self_check") or {}
    return {
        "run": name,
        "cpu_class": run["env"]["cpu_class"],
        "cpu": run["env"]["cpu"],
        "git_sha": run["env"]["git_sha"],
        "verdict": diag.get("verdict"),
        "input_share": diag.get("input_share"),
        "compute_alone_s": diag.get("compute_alone_s"),
        "step_s": diag.get("step_s"),
        "recommended": summ.get("recommended"),
        "ratio": combined.get("ratio"),
        "ratio_q1": combined.get("ratio_q1"),
        "ratio_q3": combined.get("ratio_q3"),
        "self_check_s": sc.get("min_s"),
        "self_check_ratio": sc.get("ratio"),
        "busy_share": {k: v.get("busy_share") for k, v in (run.get("cpu") or {}).items()},
        "unreliable": run.get("unreliable") or [],
        "said_keep": any("keep the current setup" in n for n in run.get("notes") or []),
        "elapsed_s": run["elapsed_s"],
        "budget_s": run["budget_s"],
        "phase_s": run.get("phase_s"),
    }


def _markdown(rows: list[dict]) -> str:
    out = [
        "# `make demo` (ptt tune on its built-in workload), quiet and busy",
        "",
        f"CPU: {rows[0]['cpu']} (class `{rows[0]['cpu_class']}`), git {rows[0]['git_sha']}. Written by "
        "`make demo-receipts` (benchmarks/demo_receipts.py): each run's receipt is in the `demo-<run>/` folder beside "
        "this page. Busy: a burner (another program) spinning on one core for the whole run.",
        "",
        "| run | verdict | compute alone s | recommended | verify ratio (IQR) | self-check s (ratio) | busy share per phase | unreliable | said keep |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x ({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f})" if r["ratio"] else "-"
        sc = f"{r['self_check_s']:.3f} ({r['self_check_ratio']:.2f}x)" if r["self_check_s"] else "-"
        busy = ", ".join(f"{k} {v:.0%}" for k, v in r["busy_share"].items() if v is not None)
        out.append(
            f"| {r['run']} | {r['verdict']} | {r['compute_alone_s'] or 0:.3f} | {', '.join(r['recommended'] or []) or '-'} "
            f"| {ratio} | {sc} | {busy} | {len(r['unreliable'])} | {'yes' if r['said_keep'] else 'no'} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quiet", type=int, default=2)
    ap.add_argument("--busy", type=int, default=1)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    runs = [f"quiet{i + 1}" for i in range(args.quiet)] + [f"busy{i + 1}" for i in range(args.busy)]
    for name in runs:
        folder = os.path.join(args.out, f"demo-{name}")
        tmp = folder + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        pid = _burner(400) if name.startswith("busy") else None
        try:
            rc = _tune(tmp, tmp + ".log")
        finally:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if rc != 0:
            with open(tmp + ".log", encoding="utf-8") as fh:
                print(fh.read()[-3000:])
            return rc
        shutil.move(tmp + ".log", os.path.join(tmp, "terminal.txt"))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        rows.append(_summary(name, folder))
        print(json.dumps(rows[-1]))
    with open(os.path.join(args.out, "demo.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(args.out, "demo.md"), "w", encoding="utf-8") as fh:
        fh.write(_markdown(rows))
    print(_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
