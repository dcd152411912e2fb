"""The documentation: README as a front door, the site's generated pages, and no figure without its results file.

The generators (docsgen/) are tested directly and fast; one slow test builds the whole site in strict mode and looks
at two pages in headless Chromium.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docsgen import api_pages, catalogue_page, cli_page, hooks, results_pages
from pytorchtricks.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HEADLINE = re.compile(r"<!-- headline:start[^\n]*-->\n(.*?)<!-- headline:end -->", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")


def _hand_written_pages() -> list[Path]:
    return sorted(p for p in (ROOT / "docs").rglob("*.md"))


# ---- README -------------------------------------------------------------------------------------------------------


def test_readme_fits_on_two_screens() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, (
        f"README.md has {len(lines)} lines; the front door stays <= 220 (move detail to docs/)"
    )


def test_readme_starts_with_the_two_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = text.split("```", 2)[1]
    assert [ln.split()[:2] for ln in first_block.strip().splitlines()] == [["make", "demo"], ["make", "test"]]


@pytest.mark.parametrize(
    ("journey", "command"),
    [("## Your script", "ptt doctor run"), ("## Your data", "ptt pack"), ("## Inference", "ptt optimize")],
)
def test_each_journey_starts_with_its_command(journey: str, command: str) -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(journey)]
    assert len(starts) == 1, f"README has no (or several) '{journey}' section"
    section = lines[starts[0] :]
    end = next((i for i, ln in enumerate(section[1:], 1) if ln.startswith("## ")), len(section))
    section = section[:end]
    first_command = next(i for i, ln in enumerate(section[1:], 1) if ln.lstrip().startswith("ptt "))
    assert command in section[first_command], f"{journey}: the first command is {section[first_command]!r}"
    assert first_command < 3, (
        f"{journey}: its command is on line {first_command + 1}; it belongs in the first three"
    )
    assert "```" in "\n".join(section[first_command:]), f"{journey}: no real output after the command"


def test_readme_links_resolve() -> None:
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue
        path = ROOT / target.split("#", 1)[0]
        assert path.exists(), f"README links to {target}, which is not in the repository"


def _numbers_in(path: Path) -> tuple[str, list[float]]:
    """The file's text and, for JSON/JSONL, every number in it (so 3.8202 backs a figure written 3.82)."""
    text = path.read_text(encoding="utf-8")
    values: list[float] = []

    def walk(v: object) -> None:
        if isinstance(v, bool):
            return
        if isinstance(v, (int, float)) and math.isfinite(v):
            values.append(float(v))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    if path.suffix in (".jsonl", ".json"):
        for line in text.splitlines() if path.suffix == ".jsonl" else [text]:
            if line.strip():
                walk(json.loads(line))
    return text, values


def _backed(figure: str, text: str, values: list[float]) -> bool:
    if re.search(rf"(?<![\w.]){re.escape(figure)}(?![\d])", text):
        return True
    x = float(figure.replace(",", ""))
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    return any(round(v, decimals) == x for v in values)


def headline_rows() -> list[list[str]]:
    m = HEADLINE.search(README.read_text(encoding="utf-8"))
    assert m, "README lacks the <!-- headline:start --> ... <!-- headline:end --> table"
    rows = [r for r in m.group(1).strip().splitlines() if r.startswith("|")][2:]  # header and rule
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows]


def test_headline_table_rows_each_cite_a_results_file_holding_their_numbers() -> None:
    rows = headline_rows()
    assert len(rows) >= 3
    for measured, result, cpu, source in rows:
        links = [t for t in LINK.findall(source) if t.startswith("results/")]
        assert links, f"headline row {measured!r} cites no results file"
        path = ROOT / links[0]
        assert path.is_file(), f"headline row {measured!r} cites {links[0]}, which does not exist"
        files = [path] + ([path.with_suffix(".jsonl")] if path.suffix == ".md" else [])
        backing = [_numbers_in(f) for f in files if f.exists()]
        for figure in NUMBER.findall(result):
            assert any(_backed(figure, t, v) for t, v in backing), (
                f"headline row {measured!r}: {figure} is not in {links[0]} (a figure needs its results file)"
            )
        assert cpu in ("Zen 4", "Zen 3", "Xeon (AMX)"), f"headline row {measured!r} names no CPU"


def test_the_headline_check_can_fail(tmp_path: Path) -> None:
    md = tmp_path / "r.md"
    md.write_text("| a | 3.68x (9.5 ms) |\n")
    text, values = _numbers_in(md)
    assert _backed("3.68", text, values)
    assert not _backed("3.69", text, values)
    assert not _backed("68", text, values)
    jl = tmp_path / "r.jsonl"
    jl.write_text(json.dumps({"ratio": 3.8202599, "n": 471}) + "\n")
    text, values = _numbers_in(jl)
    assert (
        _backed("3.82", text, values) and _backed("471", text, values) and not _backed("3.83", text, values)
    )


# ---- docs: every figure cites its results file ---------------------------------------------------------------------

# a measured figure: a speed ratio, a rate or a time (sizes such as "4 MiB blocks" are specifications, not figures)
MEASURED = re.compile(r"\d\.\d+x\b|\d images/s|\d(?:\.\d+)? ms\b")


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each section of a Markdown page, code fences kept in their section."""
    out, heading, body, fence = [], "(top)", [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"^#{1,6} ", line):
            out.append((heading, "\n".join(body)))
            heading, body = line, []
        else:
            body.append(line)
    out.append((heading, "\n".join(body)))
    return out


def test_docs_sections_with_measured_figures_link_their_results() -> None:
    missing = []
    for page in _hand_written_pages():
        for heading, body in _sections(page.read_text(encoding="utf-8")):
            if MEASURED.search(body) and not any("results/" in t for t in LINK.findall(body)):
                missing.append(f"{page.relative_to(ROOT)}: {heading}")
    assert not missing, "sections with measured figures and no link to a results file:\n" + "\n".join(missing)


def test_docs_links_into_results_point_at_files_that_exist() -> None:
    sections = {cpu: results_pages.render(cpu) for cpu in results_pages.cpu_classes()}
    raw = {dest for _src, dest in results_pages.raw_files()}
    checked = 0
    for page in _hand_written_pages():
        base = page.parent.relative_to(ROOT / "docs")
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            resolved = os.path.normpath(base / target.split("#", 1)[0]).replace(os.sep, "/")
            if not resolved.startswith("results/") or resolved == "results/index.md":
                continue
            checked += 1
            if resolved.startswith("results/files/"):
                assert resolved in raw, f"{page.name} links to {target}: no such results file"
                continue
            cpu = Path(resolved).stem
            assert cpu in sections, f"{page.name} links to {target}: no results/{cpu}/"
            anchor = target.split("#", 1)[1] if "#" in target else ""
            assert not anchor or f"{{#{anchor}}}" in sections[cpu], (
                f"{page.name} links to {target}: results/{cpu}/ has no such file"
            )
    assert checked > 20  # the guides cite their figures


# ---- generated pages ----------------------------------------------------------------------------------------------


def _ptt_list_names(capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["list", "--markdown"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    return [re.match(r"^\| `([^`]+)` \|", r).group(1) for r in rows]  # type: ignore[union-attr]


def test_catalogue_page_lists_exactly_the_tricks_of_ptt_list(capsys: pytest.CaptureFixture[str]) -> None:
    names = _ptt_list_names(capsys)
    page = catalogue_page.render()
    cards = re.findall(r"^### `([^`]+)` \{#", page, re.M)
    table = re.findall(r"^\| \[`([^`]+)`\]\(#", page, re.M)
    assert cards == names, "the catalogue page's cards are not `ptt list`'s tricks"
    assert table == names, "the catalogue page's table is not `ptt list`'s tricks"
    assert len(names) >= 30


def test_catalogue_cards_carry_their_sections() -> None:
    page = catalogue_page.render()
    fuse = page.split("### `fuse_conv_bn`", 1)[1].split("### ", 1)[0]
    assert "**Why:**" in fuse and "**When:**" in fuse and "**Caveats:**" in fuse
    assert "api/model-tricks.md#pytorchtricks.tricks.model.fuse_conv_bn.fuse_conv_bn_" in fuse


def _subcommands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append(((*prefix, name), sub))
                out += _subcommands(sub, (*prefix, name))
    return out


def test_cli_page_covers_every_subcommand() -> None:
    commands = _subcommands(build_parser())
    assert {("doctor", "run"), ("optimize",), ("list",)} <= {path for path, _sub in commands}
    page = cli_page.render()
    for path, sub in commands:
        name = " ".join(path)
        assert f"`ptt {name}` {{#ptt-{'-'.join(path)}}}" in page, (
            f"the CLI page has no section for ptt {name}"
        )
        assert f"usage: ptt {name}" in page, f"the CLI page lacks the --help of ptt {name}"
        for action in sub._actions:  # every option of every command is on the page
            for opt in action.option_strings:
                assert opt in page, f"the CLI page lacks ptt {name} {opt}"


def test_api_pages_document_every_export() -> None:
    import pytorchtricks

    pages = api_pages.pages()
    text = "\n".join(pages.values())
    for name, module in pytorchtricks._EXPORTS.items():
        assert f"`ptt.{name}`" in pages["api/index.md"], name
        assert f"::: {module}\n" in text, f"{module} (for ptt.{name}) has no API block"


def test_results_pages_are_generated_from_the_results_files() -> None:
    classes = results_pages.cpu_classes()
    assert {"avx2", "avx512_bf16"} <= set(classes)
    for cpu in classes:
        page = results_pages.render(cpu)
        files = sorted((ROOT / "results" / cpu).rglob("*.jsonl"))
        ids = re.findall(r"^### .* \{#([^}]+)\}$", page, re.M)
        jsonl_ids = {results_pages.anchor(p.relative_to(ROOT / "results" / cpu)) for p in files}
        assert jsonl_ids <= set(ids), f"results/{cpu}: files without a section: {jsonl_ids - set(ids)}"
        for p in files:  # every section of a JSONL file links to it, and its environment comes with it
            rel = p.relative_to(ROOT / "results" / cpu).as_posix()
            assert f"(files/{cpu}/{rel})" in page


def test_results_page_of_a_new_file(tmp_path: Path) -> None:
    cpu = tmp_path / "amx"
    cpu.mkdir()
    env = {"cpu": "Intel Xeon", "cpu_class": "amx", "cpu_count": 4, "torch": "2.14.1", "git_sha": "abc1234"}
    rows = [
        {"variant": "eager", "median_s": 0.5, "env": env},
        {"variant": "int8", "median_s": 0.125, "env": env},
    ]
    (cpu / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "empty").mkdir()
    assert results_pages.cpu_classes(tmp_path) == ["amx"]  # a folder with no results file gets no page
    page = results_pages.render("amx", tmp_path)
    assert "{#bench}" in page and "Intel Xeon" in page and "abc1234" in page and "0.125" in page
    assert ("results/files/amx/bench.jsonl") in {d for _s, d in results_pages.raw_files(tmp_path)}


def test_nav_lists_every_guide_journeys_first(tmp_path: Path) -> None:
    guides = hooks.guides()
    on_disk = {f"guides/{p.name}" for p in (ROOT / "docs" / "guides").glob("*.md")}
    assert set(guides) == on_disk
    assert guides[:3] == ["guides/your-script.md", "guides/your-data.md", "guides/inference.md"]
    (tmp_path / "guides").mkdir()
    for name in ("zebra.md", "inference.md", "alpha.md"):
        (tmp_path / "guides" / name).write_text("# x\n")
    assert hooks.guides(tmp_path) == ["guides/inference.md", "guides/alpha.md", "guides/zebra.md"]


def test_includes_fail_loudly_when_their_source_moves() -> None:
    assert "tests/test_floors.py" in hooks.include_section(
        "CONTRIBUTING.md", "## The floors: nothing imports upward"
    )
    with pytest.raises(ValueError, match="no line"):
        hooks.include_section("CONTRIBUTING.md", "## A heading that is not there")
    assert "test_corruption_matrix.py" in hooks.test_table("tests/shards")


# ---- the built site, looked at ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _screenshot(html: Path, png: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium (make system-deps installs it, as root)")
    profile = png.parent / f"profile-{png.stem}"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--window-size=1280,1400",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert png.exists(), f"chromium wrote no screenshot of {html}"


@pytest.mark.slow
@pytest.mark.parametrize("page", ["index.html", "catalogue/index.html", "results/avx2/index.html"])
def test_built_pages_render_in_chromium(site: Path, page: str, tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    png = tmp_path / (page.replace("/", "_") + ".png")
    _screenshot(site / page, png)
    img = Image.open(png).convert("L")
    stat = ImageStat.Stat(img)
    assert stat.stddev[0] > 20, f"{page} renders (almost) blank: pixel stddev {stat.stddev[0]:.1f}"
    dark = sum(img.histogram()[:100]) / (img.width * img.height)
    assert dark > 0.005, f"{page} has almost no text: {dark:.2%} dark pixels"


@pytest.mark.slow
def test_built_site_has_every_page(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for page in [
        "getting-started",
        "catalogue",
        "cli",
        "api",
        "shard-formats",
        "reliability",
        "architecture",
    ]:
        assert (site / page / "index.html").exists(), page
    for guide in hooks.guides():
        assert (site / guide.removesuffix(".md") / "index.html").exists(), guide
    for cpu in results_pages.cpu_classes():
        assert (site / "results" / cpu / "index.html").exists(), cpu
    html = (site / "catalogue" / "index.html").read_text(encoding="utf-8")
    for name in _ptt_list_names(capsys):
        assert f'id="{name}"' in html, f"the built catalogue has no card for {name}"
    for png in ["doctor-report.png", "tune-report.png", "memory-frontier.png"]:
        assert png in "".join(p.read_text(encoding="utf-8") for p in (site / "guides").rglob("index.html")), (
            png
        )
