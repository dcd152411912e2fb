"""The command line: listing, cards, bench with JSONL + fingerprint, report, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytorchtricks import catalogue, cli
from pytorchtricks.core import MissingExtraError, require


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_runtime_tricks(capsys) -> None:
    code, out, _ = run(capsys, "list", "--where", "runtime")
    assert code == 0
    for name in ("enable_cudnn_benchmark", "enable_tf32", "enable_determinism", "seed_everything"):
        assert name in out


def test_list_markdown_is_the_catalogue_table(capsys) -> None:
    code, out, _ = run(capsys, "list", "--markdown")
    assert code == 0
    assert out == catalogue.to_markdown()


def test_show_prints_the_card(capsys) -> None:
    code, out, _ = run(capsys, "show", "seed_everything")
    assert code == 0
    assert "PYTHONHASHSEED" in out and "Why:" in out and "ptt.seed_everything" in out


def test_bench_writes_jsonl_with_fingerprint_and_prints_stats(capsys, tmp_path) -> None:
    code, out, _ = run(capsys, "bench", "enable_tf32", "--size", "smoke", "--out", str(tmp_path))
    assert code == 0
    assert "median" in out and "IQR" in out and "ratio" in out
    rows = [json.loads(line) for line in (tmp_path / "bench-smoke-cpu.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["baseline", "treated"]
    for r in rows:
        assert r["trick"] == "enable_tf32" and r["interleaved"] is True
        assert r["median_s"] > 0 and r["iqr_s"] >= 0 and r["ratio"] > 0
        assert r["peak_method"] == "cpu_tracked"
        for key in ("torch", "cuda", "device_name", "cpu_flags", "threads", "git_sha", "command"):
            assert key in r["env"]
    # and the report command renders it
    code, md, _ = run(capsys, "report", str(tmp_path / "bench-smoke-cpu.jsonl"), "--format", "md")
    assert code == 0 and "| enable_tf32 | treated |" in md and "Environment:" in md
    code, csv_text, _ = run(capsys, "report", str(tmp_path / "bench-smoke-cpu.jsonl"), "--format", "csv")
    assert code == 0 and csv_text.splitlines()[0].startswith("trick,variant")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "no_such_trick"], "unknown trick 'no_such_trick'"),
        (["bench", "enable_tf32x"], "Did you mean enable_tf32"),
        (["bench", "enable_tf32", "--device", "tpu"], "unknown device 'tpu'"),
        (["bench", "enable_tf32", "--size", "huge"], "unknown size 'huge'"),
        (["bench"], "name at least one trick"),
        (["list", "--where", "space"], "use one of"),
        (["report", "/no/such/file.jsonl"], "no such results file"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(capsys, argv, message) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_missing_extra_is_one_line_with_the_fix(capsys, monkeypatch) -> None:
    def needs_extra(**_kw):
        require("surely_not_installed_pkg", "data")

    monkeypatch.setattr(catalogue, "select", needs_extra)
    code, _, err = run(capsys, "list")
    assert code == 2
    assert "pip install 'pytorchtricks[data]'" in err and err.count("\n") == 1
    with pytest.raises(MissingExtraError):
        needs_extra()


def test_report_rejects_a_non_jsonl_file(capsys, tmp_path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text("{not json\n")
    code, _, err = run(capsys, "report", str(bad))
    assert code == 2 and "x.jsonl:1" in err


def test_no_command_prints_help_and_exits_2(capsys) -> None:
    code, out, _ = run(capsys)
    assert code == 2 and "usage" in out.lower()


def test_console_entry_point_runs() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pytorchtricks.cli", "show", "enable_tf32"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "TensorFloat-32" in res.stdout
