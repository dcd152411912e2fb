"""``report.html`` of a tune run or a doctor run: one self-contained page (inline CSS and SVG plots, no scripts, no
network).

``render(payload)`` takes the tune receipt as plain data (``dataclasses.asdict`` of a ``TuneResult``, as also stored
in ``results.jsonl``) and returns the page; ``render_doctor(rows)`` takes the rows of a ``ptt doctor run``
results.jsonl (each row holds the text the page shows, the first batch's too). Every string from the run is
HTML-escaped. Plain data in, a page out: this floor imports none of the jobs that write pages (``analysis``,
``tune``), which sit above it.
"""

from __future__ import annotations

import html
from typing import Any

from pytorchtricks.report import plots

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:980px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;width:100%} td,th{border:1px solid #ddd;padding:3px 6px;text-align:left}
th{background:#f3f3f3} .kept{color:#1b7a6e;font-weight:600} .rejected,.failed{color:#9a3b3b} .skipped{color:#777}
.big{font-size:1.35em;font-weight:600} .muted{color:#666;font-size:.85em} .plots svg{max-width:100%;height:auto}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1em} code{background:#f5f5f5;padding:0 3px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _ratio(m: dict[str, Any] | None) -> str:
    if not m:
        return "-"
    return f"{m['ratio']:.2f}x <span class='muted'>(IQR {m['ratio_q1']:.2f}-{m['ratio_q3']:.2f})</span>"


def _mib(b: Any) -> str:
    return "-" if b is None else f"{b / 2**20:.1f} MiB"


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows]
    return "\n".join(out) + "</table>"


def _summary(p: dict[str, Any]) -> str:
    w, env = p["workload"], p["env"]
    combined = p.get("combined")
    rec = p.get("recommended") or []
    bad = p.get("unreliable") or []
    nothing = "none: the measurements are unreliable" if bad else "keep the current setup"
    lines = [
        f"<p class='big'>Recommended: {_e(', '.join(rec) or nothing)}"
        + (f" &mdash; measured {_ratio(combined)} images/s vs baseline</p>" if combined else "</p>"),
        f"<p>{_e(w['model'])} ({w['params'] / 1e6:.1f} M params), {_e(w['for'])}, batch {w['batch_size']}, "
        f"input {_e('x'.join(map(str, w['input_shape'])) if w.get('input_shape') else str(w['input_size']) + ' px')}"
        f"{', loader workers ' + str(w['num_workers']) if w.get('num_workers') else ''}, on {_e(env.get('device_name'))} ({env.get('threads')} threads, torch "
        f"{_e(env.get('torch'))}). Data: {_e(w['data'])}.</p>",
        f"<p class='muted'>Machine load at start: {_e(w.get('loadavg_1m_at_start'))} (1-minute average, "
        f"{_e(env.get('cpu_count'))} cores); OMP_WAIT_POLICY={_e(w.get('omp_wait_policy') or 'unset')}. "
        f"Goal {_e(p['goal'])}; ran {p['elapsed_s']:.0f} s of a {p['budget_s']:.0f} s budget. "
        "Speed ratios are medians of paired per-round ratios over interleaved rounds (variants timed in rotating "
        "order within each round); the recommended figure is measured "
        f"{_e(p.get('measured_in') or 'in an interleaved run with the baseline')}, never multiplied from single "
        "gains.</p>",
    ]
    acc = p.get("accuracy") or {}
    if acc.get("answer") == "outside":  # the recommendation stays, flagged: it learns differently
        lines.append(f"<p class='rejected'><b>It learns differently.</b> {_e(acc['headline'])}</p>")
    if w.get("device_step_ms"):
        lines.append(
            f"<p class='rejected'><b>A projection.</b> The step was declared: {w['device_step_ms']:g} ms on the "
            "accelerator (--device-step-ms). Each loader was timed feeding a stand-in step that held the training "
            "process that long without using this machine's cores; the figures hold for that step time, on a "
            "machine whose CPU is this one.</p>"
        )
    if bad:
        lines.append(
            "<div class='rejected'><p><b>Unreliable figures.</b> "
            + ("Nothing on this page is a finding about your setup. " if not rec else "")
            + "Rerun on a quiet machine to trust them:</p><ul>"
            + "".join(f"<li>{_e(b)}</li>" for b in bad)
            + "</ul></div>"
        )
    lines.append(_cpu_table(p))
    if p.get("interrupted"):
        lines.append(
            "<p class='rejected'>Interrupted: this receipt holds only what was measured before Ctrl-C.</p>"
        )
    cc = p.get("combined_check")
    if cc:
        lines.append(
            f"<p>Correctness of the combination: {_e(cc['kind'])}: {_e(cc['detail'])} "
            f"({'passed' if cc['passed'] else 'FAILED'}).</p>"
        )
    return "\n".join(lines)


def _cpu_table(p: dict[str, Any]) -> str:
    """Per phase: its seconds, the CPU others took (busy), ours (main process, loader workers), the run queue."""
    cpu, secs = p.get("cpu") or {}, p.get("phase_s") or {}
    if not cpu and not secs:
        return ""
    rows = []
    for phase in dict.fromkeys([*secs, *cpu]):
        d = cpu.get(phase) or {}
        rq = d.get("run_queue")
        rows.append(
            [
                _e(phase),
                f"{secs.get(phase, 0.0):.1f}",
                f"{d['busy_share']:.0%}" if "busy_share" in d else "-",
                f"{d.get('main_cpu_s', 0.0):.1f} / {d.get('workers_cpu_s', 0.0):.1f}" if d else "-",
                f"{rq:.1f}" if rq is not None else "-",
                _e(", ".join(f"{t['name']} {t['cpu_s']:.1f} s" for t in d.get("top_others") or [])),
                _e(d.get("busy") or ""),
            ]
        )
    sc = p.get("self_check") or {}
    check = ""
    if sc.get("min_s") and sc.get("tune_compute_alone_s"):
        check = (
            f"<p>Self-check: the compute step took {sc['min_s'] * 1e3:.1f} ms in a fresh process and "
            f"{sc['tune_compute_alone_s'] * 1e3:.1f} ms in tune's diagnosis ({sc['ratio']:.2f}x: "
            f"{'they agree' if sc.get('agrees') else 'they DISAGREE'}).</p>"
        )
    elif sc:
        check = f"<p class='muted'>Self-check: {_e(sc.get('skipped') or sc.get('error'))}.</p>"
    return (
        "<p>Where the seconds went, and who used the CPU meanwhile (busy: the share of the machine's cores other "
        "programs took):</p>"
        + _table(
            [
                "phase",
                "s",
                "busy",
                "ours: main / workers CPU-s",
                "run queue",
                "other programs",
                "unreliable because",
            ],
            rows,
        )
        + check
    )


def _plots(p: dict[str, Any]) -> str:
    d = p.get("diagnosis") or {}
    parts: list[str] = []
    if d.get("split_s"):
        parts.append(plots.step_breakdown(d["split_s"], p.get("after_split_s") or None))
    rows = _throughput_rows(p)
    if rows:
        parts.append(plots.throughput(rows))
    mem = _memory_rows(p)
    if mem:
        parts.append(plots.memory(mem[0], mem[1]))
    if d.get("data_stages_s"):
        parts.append(plots.data_stages(d["data_stages_s"]))
    return "<div class='plots'>" + "\n".join(f"<div>{s}</div>" for s in parts) + "</div>"


def _throughput_rows(p: dict[str, Any]) -> list[dict[str, Any]]:
    items = p["workload"]["batch_size"]
    kept = set(p.get("recommended") or [])
    source = p.get("final") or []
    if not source:  # no verification run (interrupted or no winner): the candidate runs
        bases = [b for b in (p.get("baseline"), p.get("step_baseline")) if b]
        source = [b for i, b in enumerate(bases) if b not in bases[:i]]
        source += [c["measured"] for c in p["candidates"] if c.get("measured")]
    scopes = {m.get("scope", "step") for m in source}
    rows = []
    for m in source:
        label = (
            m["label"]
            if m["label"] in ("baseline", "combined")
            else m["tricks"][0]
            if m["tricks"]
            else m["label"]
        )
        if label == "combined":
            label = "combined: " + " + ".join(m["tricks"])
        if len(scopes) > 1:
            label += f" ({m.get('scope', 'step')})"
        rows.append(
            {
                "label": label,
                "median_s": m["median_s"],
                "q1_s": m["q1_s"],
                "q3_s": m["q3_s"],
                "items": items,
                "kept": label.startswith("combined") or (m["tricks"] and set(m["tricks"]) <= kept),
            }
        )
    return rows


def _memory_rows(p: dict[str, Any]) -> tuple[list[tuple[str, int]], str] | None:
    base = p.get("baseline")
    rows = [("baseline", base["peak_bytes"])] if base and base.get("peak_bytes") is not None else []
    rows += [
        (c["name"], c["measured"]["peak_bytes"])
        for c in p["candidates"]
        if c.get("measured") and c["measured"].get("peak_bytes") is not None
    ]
    comb = p.get("combined")
    if comb and comb.get("peak_bytes") is not None and len(comb["tricks"]) > 1:
        rows.append(("combined", comb["peak_bytes"]))
    return (rows, base.get("peak_method") or "") if rows and base else None


def _candidates(p: dict[str, Any]) -> str:
    rows = []
    for c in p["candidates"]:
        chk = c.get("check")
        m = c.get("measured")
        rows.append(
            [
                f"<code>{_e(c['name'])}</code>",
                f"<span class='{_e(c['status'])}'>{_e(c['status'])}</span>",
                "exact" if c["exact"] else "approximate",
                _ratio(m)
                + (" <span class='muted'>compute step</span>" if m and m.get("scope") == "compute" else ""),
                f"{p['workload']['batch_size'] / m['median_s']:.1f}" if m else "-",
                _mib(m.get("peak_bytes")) if m else "-",
                _e(chk["detail"]) if chk else "-",
                _e(c["reason"]),
            ]
        )
    return _table(
        ["trick", "status", "kind", "speed vs baseline", "images/s", "step peak", "check", "why"], rows
    )


def _combination(p: dict[str, Any]) -> str:
    steps = p.get("combination") or []
    if not steps:
        return "<p class='muted'>Fewer than two winners: nothing to combine.</p>"
    rows = [
        [
            _e(" + ".join(s["with"])),
            f"<code>{_e(s['add'])}</code>",
            "<span class='kept'>kept</span>" if s.get("kept") else "<span class='rejected'>dropped</span>",
            _e(s.get("reason", "")),
        ]
        for s in steps
    ]
    return _table(["combination so far", "adding", "result", "measured"], rows)


def _diagnosis(p: dict[str, Any]) -> str:
    d = p.get("diagnosis")
    if not d:
        return "<p class='muted'>Not reached.</p>"
    split = ", ".join(f"{_e(k)} {v * 1e3:.1f} ms" for k, v in d["split_s"].items())
    out = [f"<p>Verdict: <b>{_e(d['verdict'])}</b>. Step {d['step_s'] * 1e3:.1f} ms: {split}.</p>"]
    if d.get("evidence"):
        out.append(f"<p>Evidence: {_e(d['evidence'])}.</p>")
    for r in d.get("remeasured") or []:
        out.append(f"<p class='muted'>Measured again: {_e(r)}.</p>")
    if d["findings"]:
        out.append(
            _table(
                ["id", "where", "finding", "fix", "source"],
                [
                    [
                        _e(f"{f['id']} {f['name']}"),
                        _e(f["location"]),
                        _e(f["message"]),
                        f"<code>{_e(f['fix'])}</code>",
                        _e(f["source"]),
                    ]
                    for f in d["findings"]
                ],
            )
        )
    mem = d.get("memory") or {}
    if mem:
        out.append(
            "<p>Memory: "
            + ", ".join(
                f"{_e(k.replace('_bytes', ''))} {_mib(v)}" for k, v in mem.items() if k.endswith("_bytes")
            )
            + f" <span class='muted'>(peak: {_e(mem.get('peak_method', ''))})</span></p>"
        )
    if mem.get("top_modules"):
        tops = "; ".join(_e(t) for t in mem["top_modules"])
        out.append(f"<p>Largest saved activations (ptt.memory_breakdown): {tops}</p>")
    rates = d.get("loader_rates") or {}
    if rates:
        out.append(
            "<p>The loaders alone (no step beside them, the user's workers):</p>"
            + _table(
                ["loader", "images/s", "CPU-s per image"],
                [
                    [_e(k), f"{v['images_per_s']:.1f}", f"{v['cpu_s_per_image']:.3f}"]
                    for k, v in rates.items()
                ],
            )
        )
    doc = d.get("data_doctor")
    if doc:
        stages = ", ".join(f"{_e(k)} {v:.1f} ms" for k, v in doc["stages_ms_per_batch"].items())
        out.append(
            f"<p>Data doctor (<code>ptt.doctor_data</code>: <code>ptt.make_loader</code> on these files, "
            f"batch {doc['batch_size']}, {doc['num_workers']} workers): {stages} per batch in one process; "
            f"the loader gives {doc['loader_images_per_s']:.0f} images/s. {_e(doc['verdict'])}. "
            f"First fix: {_e(doc['fix'])}.</p>"
        )
    return "\n".join(out)


def _memory_search(p: dict[str, Any]) -> str:
    """The memory search's section: its conclusion, the speed/memory frontier and every configuration."""
    mem = p.get("memory")
    if not mem:
        return ""
    rec = " + ".join(mem.get("recommended") or []) or None
    pts = []
    for pt in mem["points"]:
        m = pt.get("measured")
        if m and pt.get("peak_bytes") is not None:
            items = m["items_per_s"] * m["median_s"]
            pts.append({
                "label": " + ".join(pt["tricks"]) or "baseline", "peak_bytes": pt["peak_bytes"],
                "items_per_s": m["items_per_s"], "lo": items / m["q3_s"], "hi": items / m["q1_s"],
                "front": pt.get("front"),
            })  # fmt: skip
    plot = plots.memory_frontier(pts, mem.get("budget_bytes"), rec) if pts else ""
    rows = []
    for pt in mem["points"]:
        m = pt.get("measured")
        fits = {True: "yes", False: "no"}.get(pt.get("fits"), "-")
        rows.append([
            _e(" + ".join(pt["tricks"]) or "baseline"), _mib(pt.get("predicted_bytes")), _mib(pt.get("peak_bytes")),
            _mib(pt.get("reserved_bytes")) if pt.get("reserved_bytes") else "-", fits,
            f"{m['items_per_s']:.1f}" if m else "-", _ratio(m) if m else "-", _e(pt["status"]), _e(pt.get("reason")),
        ])  # fmt: skip
    err = mem.get("estimate_error")
    head = (
        f"<p class='big'>{_e(mem.get('message'))}</p><p>Budget {_mib(mem.get('budget_bytes'))}; baseline peak "
        f"{_mib(mem.get('baseline_peak_bytes'))}; the estimate (ptt.estimate_memory) was "
        f"{'-' if err is None else f'{err:+.1%}'} off on the baseline. Peaks: bytes held between steps + the step's "
        "own peak, measured on one steady step each; speed: the compute step, interleaved with the baseline.</p>"
    )
    cols = ["configuration", "predicted peak", "measured peak", "reserved", "fits", "images/s", "speed", "status",
            "why"]  # fmt: skip
    return f"<h2>Memory search</h2>\n{head}\n<div>{plot}</div>\n{_table(cols, rows)}"


def _accuracy(p: dict[str, Any]) -> str:
    """The parity check's section (``ptt tune --accuracy-steps``): the answer, the rule, the band and the
    trajectories (a plot and the figures at a few steps); empty without a check."""
    acc = p.get("accuracy")
    if not acc:
        return ""
    head = (
        f"<h2>Learns the same?</h2>\n<p class='big {'kept' if acc['answer'] == 'inside' else 'rejected'}'>"
        f"{_e(acc['headline'])}</p>"
    )
    if not acc.get("lower"):
        return head
    n = len(acc["lower"])
    rule = (
        f"<p>{acc['steps']} training steps from one initialisation, seeds 0-{acc['seeds'] - 1} (the seed drives "
        f"the data order and augmentation), baseline and {_e(' + '.join(acc['recommended']))}. Rule: "
        f"{_e(acc['rule'])}. Inside at {acc['share_inside']:.0%} of the steps; at the last step "
        f"{'inside' if acc['final_inside'] else 'outside'}. Every loss is in results.jsonl (tune-accuracy).</p>"
    )
    at = sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1})
    rows = [[str(i + 1), f"{acc['band_min'][i]:.4g}-{acc['band_max'][i]:.4g}",
             f"{acc['lower'][i]:.4g}-{acc['upper'][i]:.4g}", _e(f"{float(acc['recommended_mean'][i]):.4g}")]
            for i in at]  # fmt: skip
    table = _table(["step", "baseline min-max", "band (widened)", "recommended mean"], rows)
    return f"{head}\n{rule}\n<div class='plots'>{plots.loss_band(acc)}</div>\n{table}"


def render(p: dict[str, Any]) -> str:
    """The whole page for receipt ``p``."""
    notes = "".join(f"<li>{_e(n)}</li>" for n in p.get("notes") or [])
    env = p["env"]
    env_rows = [[_e(k), _e(v)] for k, v in env.items()]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ptt tune: {_e(p["workload"]["model"])}</title>
<style>{CSS}</style></head><body>
<h1>ptt tune receipt</h1>
{_summary(p)}
{_memory_search(p)}
{_accuracy(p)}
<h2>Plots</h2>
{_plots(p)}
<h2>Candidates</h2>
{_candidates(p)}
<h2>Greedy combination</h2>
{_combination(p)}
<h2>Diagnosis</h2>
{_diagnosis(p)}
<h2>Notes</h2>
<ul>{notes or "<li>none</li>"}</ul>
<h2>Environment</h2>
{_table(["key", "value"], env_rows)}
<p class="muted">Generated by pytorchtricks <code>ptt tune</code>. results.jsonl holds every number on this page;
apply.py applies the recommended tricks.</p>
</body></html>
"""


def render_doctor(
    rows: list[dict[str, Any]],
    compared: list[str] | None = None,
    earlier_mean_s: dict[str, float] | None = None,
) -> str:
    """The page of a ``ptt doctor run`` (or ``ptt.watch``): verdict and first fix, the split per stage (beside an
    earlier run's when ``compared``), each measured step, the loaders, model, optimizer, host syncs, the lines of the
    script they come from, and the environment."""
    run = next(r for r in rows if r["kind"] == "doctor-run")
    summ = next(r for r in rows if r["kind"] == "doctor-summary")
    steps = [r for r in rows if r["kind"] == "doctor-step"]
    stages = [k for k in summ["mean_s"] if k != "step"]
    mean = {k: summ["mean_s"][k] for k in stages}
    before = {k: earlier_mean_s.get(k, 0.0) for k in stages} if earlier_mean_s else None
    plot = (
        (plots.step_breakdown(before, mean, labels=("earlier run", "this run")) if before
         else plots.step_breakdown(mean, None, labels=("this run", "")))
        if steps else ""
    )  # fmt: skip
    step_rows = [[str(s["index"])] + [f"{s[k] * 1e3:.1f}" for k in (*stages, "step")] for s in steps]
    loader_rows = [
        [_e(x.get(k, "-")) for k in ("via", "dataset", "samples", "batch_size", "num_workers", "pin_memory",
                                     "persistent_workers", "prefetch_factor")] + [_e(x.get("transform") or "-")]
        for x in summ["loaders"]
    ]  # fmt: skip
    sites = summ.get("sites") or {}
    site_rows = [
        [_e(k), _e(f"{v['file']}:{v['line']}"), f"<code>{_e(v['code'])}</code>"] for k, v in sites.items()
    ]
    sync_rows = [[_e(w), f"{n:.1f}"] for w, n in summ.get("syncs_per_step") or []]
    model, opt = summ.get("model") or {}, summ.get("optimizer") or {}
    what = []
    if model:
        what.append(
            f"model {_e(model['class'])} ({model['params'] / 1e6:.1f} M params), first batch "
            f"{_e(summ['first_batch'])}"
        )
    if opt:
        what.append("optimizer " + _e(", ".join(f"{k}={v}" for k, v in opt.items())))
    if summ.get("peak_rss_bytes"):
        what.append(f"peak resident memory of the process {_mib(summ['peak_rss_bytes'])}")
    changed = "".join(f"<li>{_e(x)}</li>" for x in compared or [])
    lint_rows = [[_e(f["id"]), _e(f["name"]), _e(f["location"]), _e(f["message"]), _e(f["fix"])]
                 for f in summ.get("lint") or []]  # fmt: skip
    env_rows = [[_e(k), _e(v)] for k, v in (run.get("env") or {}).items()]
    head = ["step", *stages, "step total"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ptt doctor run: {_e(" ".join(run["argv"]))}</title>
<style>{CSS}</style></head><body>
<h1>ptt doctor run</h1>
<p><code>{_e(" ".join(run["argv"]))}</code> &mdash; {_e(run["ended"])}</p>
<p class="big">Verdict: {_e(summ["verdict"])}</p>
<p>{_e(summ["evidence"])}</p>
<p><b>First fix:</b> {_e(summ["fix"])}</p>
{"<h2>Changed since the earlier run</h2><ul>" + changed + "</ul>" if changed else ""}
<h2>Where a step's time goes</h2>
<div class="plots">{plot}</div>
{_table(head, step_rows) if step_rows else "<p>no step was measured</p>"}
<p class="muted">Milliseconds per optimizer step ({
        run["warmup"]
    } warm-up step(s) not shown). Data wait: inside the
DataLoader iterator; forward: the outermost module call; backward: Tensor.backward; optimizer: optimizer.step();
other: the rest of the step (copies, logging, the loop itself).</p>
<h2>What the script built</h2>
<p>{"; ".join(what) or "no model or optimizer was seen"}</p>
{
        _table(
            [
                "loader",
                "dataset",
                "samples",
                "batch",
                "workers",
                "pin_memory",
                "persistent",
                "prefetch",
                "transform",
            ],
            loader_rows,
        )
        if loader_rows
        else "<p>no DataLoader was iterated</p>"
    }
{_table(["object", "where", "line"], site_rows) if site_rows else ""}
<h2>ptt lint on the model (its real input shape)</h2>
{_table(["id", "rule", "where", "what", "fix"], lint_rows) if lint_rows else "<p>no finding</p>"}
<h2>Host syncs per measured step</h2>
{_table(["call site", "per step"], sync_rows) if sync_rows else "<p>none from the script's own files</p>"}
<h2>Environment</h2>
{_table(["key", "value"], env_rows)}
<p class="muted">Generated by pytorchtricks <code>ptt doctor run</code>; results.jsonl beside it holds every number.</p>
</body></html>
"""


def render_yolo(p: dict[str, Any]) -> str:
    """The page of an Ultralytics tune receipt (``tune.yolo``): its candidates, the recommendation, the workload."""
    wl = p["workload"]
    rows = [
        [
            f"<code>{_e(c['line'] or 'stock')}</code>",
            f"{c['images_per_s']:.1f}",
            f"{c['batch_s_median'] * 1e3:.0f} ms <span class='muted'>({c['batch_s_q1'] * 1e3:.0f}-"
            f"{c['batch_s_q3'] * 1e3:.0f})</span>",
            _ratio(c),
            "-"
            if c["psnr_db_median"] is None
            else f"{c['psnr_db_median']:.1f} dB (lowest {c['psnr_db_min']:.1f})",
            "-" if not c.get("projected_gain") else f"{c['projected_gain']:.2f}x",
            "<span class='kept'>recommended</span>" if c["recommended"] else "",
        ]
        for c in p["candidates"]
    ]
    args = [[_e(k), _e(v)] for k, v in sorted(wl["args"].items())]
    env = [[_e(k), _e(v)] for k, v in p["env"].items()]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ptt tune: Ultralytics {_e(wl["trainer"])}</title>
<style>{CSS}</style></head><body>
<h1>ptt tune receipt: Ultralytics YOLO</h1>
<p class="big">{_e(("Recommended: " if p["recommended"] else "No change: ") + p["why"])}</p>
<p><code>{_e(" ".join(wl["command"]))}</code>: {wl["images"]} training images, batch {wl["batch"]},
{wl["workers"]} loader workers. The step is projected with {_e(p["step_from"])}.</p>
<h2>Its data pipeline, {p["rounds"]} interleaved rounds</h2>
{
        _table(
            [
                "candidate",
                "images/s",
                "per batch (IQR)",
                "vs stock",
                "PSNR vs stock load",
                "projected step",
                "",
            ],
            rows,
        )
    }
<h2>The trainer's arguments</h2>
{_table(["argument", "value"], args)}
<h2>Environment</h2>
{_table(["key", "value"], env)}
<p class="muted">Generated by pytorchtricks <code>ptt doctor run --tune</code>. results.jsonl holds every number on this
page; apply.py is the training call with the recommended line.</p>
</body></html>
"""
