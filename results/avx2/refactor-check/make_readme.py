import json, collections, statistics, sys
import os
R = os.path.dirname(os.path.abspath(__file__)) + '/'
def dl(p, per_run=0):
    d=collections.defaultdict(dict); env=None
    for i, l in enumerate(open(p)):
        r=json.loads(l)
        key = i // per_run if per_run else r['round']
        if 'round' in r and 'images_per_s' in r: d[key][r['system']]=r['images_per_s']; env=r.get('env',env)
    return d, env
def ratios(d, s):
    out=[]
    for rd in sorted(d):
        if s in d[rd] and 'imagefolder' in d[rd]:
            out += [d[rd][s][e]/d[rd]['imagefolder'][e] for e in range(2)]
    return out
def fmt(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-"
lines=["# Issue 19 refactor check: benchmark ratios before (ce3eee7) and after the refactor", "",
"AMD EPYC Zen 3 (cpu_class avx2: AVX2 + FMA, no AVX-512/VNNI), 2 cores, quiet machine (no other benchmark or test "
"ran; flock /tmp/ptt-bench.lock). `before` = ce3eee7, the commit before issue 19's first change; `after` = the "
"refactored tree. Raw rows: the .jsonl files here (each with its environment and git sha). This page: "
"`python3 make_readme.py data_loading-2000-alternated-before.jsonl data_loading-2000-alternated-after.jsonl > README.md` "
"in this folder; the data rows come from `benchmarks/data_loading.py --images 2000` and `benchmarks/inference_cpu.py "
"--batches 1 --rounds 3` run in a worktree of each commit (`PYTHONPATH=<tree>/src`).", ""]
lines += ["## make bench-data (2000 photos of 0.3-1 MP, RandomResizedCrop 224 + flip, batch 256, 2 workers)", "",
"x ImageFolder in the same round, median (min-max) over rounds x 2 epochs. `ptt-files` before is the whole-image "
"scaled decode, which is `ptt-files-nowindow` after (issue 21 added the window decode as the default since, so "
"`ptt-files` and `ptt-shards` after include that change).", "",
"| system | before | after |", "|---|---|---|"]
b,_=dl(R+'data_loading-2000-before.jsonl'); a,_=dl(R+'data_loading-2000-after.jsonl')
systems=list(a[0])
for s in systems:
    lines.append(f"| {s} | {fmt(ratios(b, 'ptt-files' if s=='ptt-files-nowindow' else s)) if s!='ptt-files' else fmt(ratios(b,s))+' (whole)'} | {fmt(ratios(a,s))} |")
extra = sys.argv[1:] 
if extra:
    bb,_=dl(extra[0], 3); aa,_=dl(extra[1], 3)
    lines += ["", "Re-run alternating before and after (one round each, 3 times), the systems whose first runs did not overlap:", "",
              "| system | before | after |", "|---|---|---|"]
    for s in ('ptt-ram-cache','ptt-shards-noscale'):
        lines.append(f"| {s} | {fmt(ratios(bb,s))} | {fmt(ratios(aa,s))} |")
    if os.path.exists(R + 'data_loading-2000-files-alternated-before.jsonl'):
        fb,_=dl(R + 'data_loading-2000-files-alternated-before.jsonl', 2); fa,_=dl(R + 'data_loading-2000-files-alternated-after.jsonl', 2)
        lines.append(f"| make_loader on the files, whole-image scaled decode (before: ptt-files, after: ptt-files-nowindow; "
                     f"data_loading-2000-files-alternated-*.jsonl) | {fmt(ratios(fb,'ptt-files'))} | {fmt(ratios(fa,'ptt-files-nowindow'))} |")
lines += ["", "## make bench-infer, batch 1 (ResNet-18 160 px, 3 interleaved rounds)", "",
"Speed-up vs eager fp32 in the same run, median [IQR].", "", "| variant | threads | before | after |", "|---|---|---|---|"]
def inf(p):
    d={}
    for l in open(p):
        r=json.loads(l); v=r['variant']
        if v.startswith('int8'): v='int8 oneDNN plan'
        d[(v,r['threads'])]=(r['speedup_vs_eager'],r['speedup_q1'],r['speedup_q3'])
    return d
ib=inf(R+'inference_cpu-b1-before.jsonl'); ia=inf(R+'inference_cpu-b1-after.jsonl')
f=lambda v: f"{v[0]:.2f} [{v[1]:.2f}-{v[2]:.2f}]" if v else "-"
for k in ia:
    if k[0]=='eager fp32': continue
    lines.append(f"| {k[0]} | {k[1]} | {f(ib.get(k))} | {f(ia[k])} |")
import os
cf = R + 'compile_freezing-b1-t1-alternated.txt'
if os.path.exists(cf):
    rows = [l.split() for l in open(cf)]
    lines += ["", "compile+freezing at 1 thread did not overlap, so it was re-run alone (`compile_freezing-b1-t1-alternated.txt`: "
              "eager fp32 / compile+freezing, 9 paired rounds of 10 calls per run, before and after alternated 3 times): "
              + "; ".join(f"{r[0]} {r[2]} ({r[4]}-{r[6]})" for r in rows)
              + ". Inductor's compiled ResNet-18 at batch 1 lands anywhere in 0.8-1.2x eager from run to run, with the same code; "
              "the refactor did not move it."]
print("\n".join(lines))
