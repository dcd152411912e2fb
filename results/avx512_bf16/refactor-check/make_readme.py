"""Writes README.md here from the four bench-infer b8 runs (python3 make_readme.py > README.md)."""

import json
import os

R = os.path.dirname(os.path.abspath(__file__)) + "/"
RUNS = ["after-run1", "before-run1", "after-run2", "before-run2"]  # the order they ran in


def load(run):
    out = {}
    for line in open(R + f"inference_cpu-b8-{run}.jsonl"):
        r = json.loads(line)
        name = "int8 oneDNN plan" if r["variant"].startswith("int8") else r["variant"]
        out[(name, r["threads"])] = (r["speedup_vs_eager"], r["speedup_q1"], r["speedup_q3"])
    return out


runs = {k: load(k) for k in RUNS}
env = json.loads(open(R + "inference_cpu-b8-after-run1.jsonl").readline())["env"]
lines = [
    "# Issue 19 refactor check on Zen 4: make bench-infer at batch 8, before (ce3eee7) and after (a002b6f)",
    "",
    f"{env['cpu']} Zen 4 (cpu_class {env['cpu_class']}: {', '.join(env['cpu_flags'])}), {env['cpu_count']} cores, "
    f"torch {env['torch']}, quiet machine (flock /tmp/ptt-bench.lock, nothing else running). Each run is "
    "`benchmarks/inference_cpu.py --batches 8 --rounds 3` in a worktree of its commit (`PYTHONPATH=<tree>/src`); "
    f"they ran in the order {', '.join(RUNS)}. Cells: speed-up vs eager fp32 in the same run, median [IQR over "
    "the 3 rounds]. 'spreads overlap': the range from the lowest Q1 to the highest Q3 of the two before-runs "
    "meets that of the two after-runs. This page: `python3 make_readme.py > README.md` here; the raw rows "
    "(environment, git sha) are the .jsonl files beside it. The batch-1 check is in results/avx2/refactor-check "
    "(Zen 3). The picker row did not exist before the refactor, so it is left out.",
    "",
    "| variant | threads | " + " | ".join(RUNS) + " | spreads overlap |",
    "|---|---|" + "---|" * (len(RUNS) + 1),
]
keys = [k for k in runs["after-run1"] if not k[0].startswith("picker") and k[0] != "eager fp32"]
bad = []
for k in sorted(keys, key=lambda k: (k[1], list(runs["after-run1"]).index(k))):
    cells = [f"{runs[r][k][0]:.2f} [{runs[r][k][1]:.2f}-{runs[r][k][2]:.2f}]" for r in RUNS]
    span = {
        side: (min(runs[r][k][1] for r in RUNS if r.startswith(side)), max(runs[r][k][2] for r in RUNS if r.startswith(side)))
        for side in ("before", "after")
    }
    ok = not (span["before"][1] < span["after"][0] or span["after"][1] < span["before"][0])
    bad += [] if ok else [f"{k[0]} t{k[1]}"]
    lines.append(f"| {k[0]} | {k[1]} | " + " | ".join(cells) + f" | {'yes' if ok else '**no**'} |")
first = [
    f"{k[0]} t{k[1]}"
    for k in keys
    if runs["before-run1"][k][2] < runs["after-run1"][k][1] or runs["after-run1"][k][2] < runs["before-run1"][k][1]
]
lines += [
    "",
    f"Rows whose spreads do not overlap: {', '.join(bad) if bad else 'none'}. Within the first pair of runs alone "
    f"{len(first)} of {len(keys)} rows did not overlap ({', '.join(first)}), ORT's among them, which the refactor "
    "does not touch: this VM's drift from run to run is wider than one run's IQR, so each side got a second run.",
    "",
]
print("\n".join(lines))
