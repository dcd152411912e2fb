"""The results pages: one per CPU class, generated from ``results/<class>/`` - every JSONL file with its environment.

A file's section holds the environment its rows record (CPU, flags, cores, threads, torch, git, time, command), then
the table the benchmark wrote beside it (``<stem>.md``, made from the same rows) or, where there is none, a table
rendered here from the rows themselves. Nothing is typed in by hand: a figure with no results file is not written.
The raw files are copied into the site under ``results/files/`` and linked from their sections.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from docsgen import RESULTS

RAW_SUFFIXES = (".jsonl", ".txt", ".json", ".svg")  # the .md tables are shown on the pages themselves
CLASS_NOTES = {
    "avx512_bf16": "AVX-512 with avx512_bf16 and avx512_vnni: native bf16, int8 with VNNI.",
    "avx512": "AVX-512 without native bf16.",
    "avx2": "AVX2 + FMA only: bf16 emulated (several times slower than fp32), int8 without VNNI.",
    "amx": "AVX-512 with AMX tiles.",
}


def cpu_classes(root: Path = RESULTS) -> list[str]:
    """The CPU-class folders under results/ (those holding at least one JSONL file)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.rglob("*.jsonl")))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of a JSONL file (non-finite floats such as ``Infinity`` allowed, as json writes them)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def anchor(rel: Path) -> str:
    """Section id of a results file: ``loop/bench-full-cpu.jsonl`` -> ``loop-bench-full-cpu``."""
    return re.sub(r"[^a-z0-9_-]+", "-", str(rel.with_suffix("")).lower()).strip("-")


def raw_link(cpu: str, rel: Path) -> str:
    """Link from ``results/<cpu>.md`` to the raw copy of a file."""
    return f"files/{cpu}/{rel.as_posix()}"


def _envs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    envs = [
        r.get("env") or r["environment"]
        for r in rows
        if isinstance(r.get("env") or r.get("environment"), dict)
    ]
    for r in rows:  # tune receipts keep the env inside the measured rows too
        m = r.get("measured")
        if isinstance(m, dict) and isinstance(m.get("env"), dict):
            envs.append(m["env"])
    return envs


def _join(values: list[Any]) -> str:
    seen: list[str] = []
    for v in values:
        s = ", ".join(map(str, v)) if isinstance(v, list) else str(v)
        if v not in (None, "") and s not in seen:
            seen.append(s)
    return "; ".join(seen) if seen else "-"


def environment(rows: list[dict[str, Any]]) -> list[str]:
    """The environment the rows record, as a Markdown table (or the sentence saying there is none)."""
    envs = _envs(rows)
    if not envs:
        return [
            "*These rows record no environment of their own: the folder's README says where they ran.*",
            "",
        ]
    times = sorted(str(e["time_utc"]) for e in envs if e.get("time_utc"))
    fields = [
        ("CPU", _join([e.get("cpu") or e.get("device_name") for e in envs])),
        ("CPU class", _join([e.get("cpu_class") for e in envs])),
        ("CPU flags", _join([e.get("cpu_flags") for e in envs])),
        ("cores", _join([e.get("cpu_count") for e in envs])),
        ("threads", _join([e.get("threads") for e in envs])),
        ("ISA limits", _join([json.dumps(e["isa_limits"]) for e in envs if e.get("isa_limits")]) or "-"),
        ("device", _join([e.get("device") for e in envs])),
        ("torch", _join([e.get("torch") for e in envs])),
        ("python", _join([e.get("python") for e in envs])),
        ("git", _join([e.get("git_sha") for e in envs])),
        (
            "time (UTC)",
            (times[0] if times[0] == times[-1] else f"{times[0]} to {times[-1]}") if times else "-",
        ),
        ("command", _join([f"`{e['command']}`" for e in envs if e.get("command")])),
    ]
    out = ["| environment | |", "|---|---|"]
    out += [f"| {k} | {v.replace('|', '/')} |" for k, v in fields if v != "-"]
    return [*out, ""]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    if isinstance(v, dict):
        return "-"
    return "-" if v is None else str(v).replace("|", "/").replace("\n", " ")


def _ratio(m: dict[str, Any] | None) -> str:
    if not m or m.get("ratio") is None:
        return "-"
    return f"{m['ratio']:.2f}x ({m['ratio_q1']:.2f}-{m['ratio_q3']:.2f})"


def _tune_table(rows: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    summary = [r for r in rows if r.get("kind") == "tune-summary"]
    diag = [r for r in rows if r.get("kind") == "tune-diagnosis"]
    for d in diag:
        out.append(
            f"Diagnosis: **{d.get('verdict')}** (input share {_fmt(d.get('input_share'))}, step {_fmt(d.get('step_s'))} s)."
        )
    for s in summary:
        rec = ", ".join(s.get("recommended") or []) or "nothing"
        out.append(f"Recommended: **{rec}**; combined {_ratio(s.get('combined'))}.")
    out += ["", "| candidate | status | speed vs baseline (IQR) | reason |", "|---|---|---|---|"]
    for r in rows:
        if r.get("kind") == "tune-candidate":
            out.append(
                f"| `{r['name']}` | {r.get('status')} | {_ratio(r.get('measured'))} | {_fmt(r.get('reason'))} |"
            )
    points = [r for r in rows if r.get("kind") == "tune-memory-point"]
    if points:
        out += [
            "",
            "| configuration | predicted MiB | measured peak MiB | fits | status |",
            "|---|---|---|---|---|",
        ]
        for r in points:
            mib = [
                None if b is None else f"{b / 2**20:.0f}"
                for b in (r.get("predicted_bytes"), r.get("peak_bytes"))
            ]
            out.append(
                f"| `{r.get('label')}` | {_fmt(mib[0])} | {_fmt(mib[1])} | {_fmt(r.get('fits'))} | {_fmt(r.get('status'))} |"
            )
    verify = [r for r in rows if r.get("kind") == "tune-verify"]
    if verify:
        out += ["", "| verify run | speed (IQR) | images/s |", "|---|---|---|"]
        out += [f"| `{r.get('label')}` | {_ratio(r)} | {_fmt(r.get('items_per_s'))} |" for r in verify]
    return [*out, ""]


def _generic_table(rows: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in keys and k != "env" and not isinstance(v, dict):
                keys.append(k)
    keys = keys[:10]
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return [*out, ""]


def _demote(md: str, by: int) -> str:
    """Push Markdown headings down ``by`` levels (the file's own title becomes a sub-heading of its section)."""
    return re.sub(r"^(#{1,6}) ", lambda m: "#" * min(6, len(m.group(1)) + by) + " ", md, flags=re.M)


def _relink(md: str, cpu: str, rel_dir: Path, folder: Path) -> str:
    """A results page's relative links to files beside it (a plot, a raw file) pointed at their copies in the site
    (``files/<cpu>/...``); links elsewhere are left as they are."""

    def one(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("#", "/")) or not (folder / target).is_file():
            return m.group(0)
        if (folder / target).suffix not in RAW_SUFFIXES:
            return m.group(0)
        return f"{m.group(1)}({raw_link(cpu, rel_dir / target)})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", one, md)


def jsonl_section(cpu: str, path: Path, root: Path = RESULTS) -> list[str]:
    """The section of one JSONL file: heading, raw links, environment, then its table."""
    rel = path.relative_to(root / cpu)
    rows = read_rows(path)
    md = path.with_suffix(".md")
    links = f"[`{rel.as_posix()}`]({raw_link(cpu, rel)})"
    out = [f"### {rel.with_suffix('').as_posix()} {{#{anchor(rel)}}}", "", f"{len(rows)} rows: {links}", ""]
    out += environment(rows)
    if md.exists():
        out += [_relink(_demote(md.read_text(encoding="utf-8").strip(), 3), cpu, rel.parent, md.parent), ""]
    elif any(str(r.get("kind", "")).startswith("tune-") for r in rows):
        out += _tune_table(rows)
    else:
        out += _generic_table(rows)
    return out


def _other_section(cpu: str, path: Path, root: Path = RESULTS) -> list[str]:
    """A command's output (.txt) or a receipt (.json): its environment (a receipt's own, or the receipt beside an
    output), and the output itself, folded."""
    rel = path.relative_to(root / cpu)
    out = [f"### {rel.as_posix()} {{#{anchor(Path(rel.as_posix().replace('.', '-')))}}}", ""]
    out += [f"[`{rel.as_posix()}`]({raw_link(cpu, rel)})", ""]
    receipt = path if path.suffix == ".json" else path.with_suffix(".json")
    data = json.loads(receipt.read_text(encoding="utf-8")) if receipt.exists() else None
    if isinstance(data, dict) and _envs([data]):
        out += environment([data])
    elif path.suffix == ".txt":
        out += [
            "*This output records no environment of its own: the guide that cites it says where it ran.*",
            "",
        ]
    if path.suffix == ".txt":
        out += ['??? note "the output"', "", "    ```text"]
        out += ["    " + line for line in path.read_text(encoding="utf-8").rstrip().splitlines()]
        out += ["    ```", ""]
    return out


def render(cpu: str, root: Path = RESULTS) -> str:
    """The page of one CPU class."""
    base = root / cpu
    jsonl = sorted(base.rglob("*.jsonl"))
    paired = {p.with_suffix(".md") for p in jsonl}
    others = sorted(
        p
        for p in base.rglob("*")
        if p.is_file() and p.suffix in (".txt", ".json") and p.name != "README.md" and p not in paired
    )
    lines = [
        f"# Results: `{cpu}`",
        "",
        f"{CLASS_NOTES.get(cpu, '')} Every section below is one file of `results/{cpu}/`, with the environment "
        "its rows record; the tables are the benchmarks' own (written beside the JSONL from the same rows) or "
        "rendered here from the rows. Generated when the site is built.",
        "",
        "| file | rows | when (UTC) | git |",
        "|---|---|---|---|",
    ]
    for p in sorted(jsonl, key=lambda q: (q.parent != base, q)):  # the class's own files first, then folders
        rows = read_rows(p)
        envs = _envs(rows)
        times = sorted(str(e.get("time_utc", ""))[:16] for e in envs if e.get("time_utc"))
        lines.append(
            f"| [{p.relative_to(base).with_suffix('').as_posix()}](#{anchor(p.relative_to(base))}) | {len(rows)} | "
            f"{times[0] if times else '-'} | {_join([e.get('git_sha') for e in envs])} |"
        )
    lines.append("")
    top = [p for p in jsonl if p.parent == base]
    if top:
        lines += ["## Benchmarks", ""]
        for p in top:
            lines += jsonl_section(cpu, p, root)
    for folder in sorted({p.parent for p in jsonl} - {base}):
        lines += [
            f"## {folder.relative_to(base).as_posix()}/ {{#{anchor(folder.relative_to(base))}-folder}}",
            "",
        ]
        readme = folder / "README.md"
        if readme.exists():
            lines += [_demote(readme.read_text(encoding="utf-8").strip(), 2), ""]
        for p in jsonl:
            if p.parent == folder:
                lines += jsonl_section(cpu, p, root)
    if others:
        lines += ["## Command outputs and receipts", ""]
        for p in others:
            lines += _other_section(cpu, p, root)
    return "\n".join(lines)


def index(root: Path = RESULTS) -> str:
    """``results/index.md``: the classes, from results/README.md's own text, and links to each page."""
    lines = [
        "# Results",
        "",
        "Measured results, one page per CPU class. Generated from `results/` at build time.",
        "",
    ]
    for cpu in cpu_classes(root):
        n = len(list((root / cpu).rglob("*.jsonl")))
        lines.append(f"- [`{cpu}`]({cpu}.md): {CLASS_NOTES.get(cpu, '')} {n} JSONL files.")
    lines.append("")
    loose = sorted(p for p in root.glob("*.txt"))
    if loose:
        lines += ["Outputs that do not depend on the CPU:", ""]
        lines += [f"- [`{p.name}`](files/{p.name})" for p in loose]
        lines.append("")
    readme = root / "README.md"
    if readme.exists():
        lines += [_demote(readme.read_text(encoding="utf-8").strip(), 1), ""]
    return "\n".join(lines)


def raw_files(root: Path = RESULTS) -> list[tuple[Path, str]]:
    """(file, its path in the site) of every raw results file copied into the site."""
    out = [(p, f"results/files/{p.name}") for p in sorted(root.glob("*.txt"))]
    for cpu in cpu_classes(root):
        for p in sorted((root / cpu).rglob("*")):
            if p.is_file() and p.suffix in RAW_SUFFIXES:
                out.append((p, f"results/files/{cpu}/{p.relative_to(root / cpu).as_posix()}"))
    return out
