"""report.html and its plots: self-contained, escaped, and showing the four plots."""

from __future__ import annotations

from pytorchtricks.report import html, plots
from pytorchtricks.tune.candidates import Check
from pytorchtricks.tune.diagnose import Diagnosis, Finding
from pytorchtricks.tune.measuring import CandidateResult, Measured, TuneResult
from pytorchtricks.tune.receipt import apply_snippet, payload, rows


def _m(label, tricks, median, ratio, peak=1 << 20):
    return Measured(
        label,
        tricks,
        median,
        median * 0.95,
        median * 1.05,
        32 / median,
        ratio,
        ratio * 0.97,
        ratio * 1.03,
        5,
        peak,
        "cpu_tracked",
    )


def _result() -> TuneResult:
    diag = Diagnosis(
        split_s={"data wait": 0.02, "forward": 0.05, "backward": 0.08, "optimizer": 0.01},
        step_s=0.16,
        verdict="compute-bound",
        findings=[
            Finding(
                "PTL001",
                "conv-bias-before-bn",
                "0",
                "a <b>bias</b> feeds BN",
                "",
                "ptt.remove_conv_bias_before_bn_(model)",
            )
        ],
        memory={
            "params_bytes": 1 << 22,
            "activations_bytes": 1 << 23,
            "step_peak_bytes": 1 << 24,
            "peak_method": "cpu_tracked",
        },
        data_stages_s={"read file": 1e-5, "decode": 2e-4, "resize": 5e-5, "collate": 1e-5},
        conv_bias_pairs=["0"],
        conv_bn_pairs=1,
        has_conv2d=True,
        bf16_native=True,
    )
    ok = Check("exact", True, "max rel. diff 1e-7", {"out_rel": 1e-7})
    res = TuneResult(
        workload={
            "model": "torchvision:resnet18",
            "data": "demo",
            "batch_size": 32,
            "input_size": 64,
            "for": "train",
            "device": "cpu",
            "num_outputs": 10,
            "params": 11_000_000,
        },
        env={"device_name": "Test CPU", "threads": 2, "torch": "2.x"},
        goal="speed",
        budget_s=60,
        diagnosis=diag,
        baseline=_m("baseline", (), 0.2, 1.0),
        candidates=[
            CandidateResult(
                "mixed_precision",
                "kept",
                "faster",
                False,
                _m("mixed_precision", ("mixed_precision",), 0.1, 2.0),
                ok,
            ),
            CandidateResult(
                "to_channels_last",
                "rejected",
                "slower",
                True,
                _m("to_channels_last", ("to_channels_last",), 0.25, 0.8),
                ok,
            ),
            CandidateResult("pin_memory", "skipped", "CPU run", True),
        ],
        recommended=("mixed_precision",),
        after_split_s={"forward": 0.03, "backward": 0.05},
        notes=["note with <script>alert(1)</script>"],
        elapsed_s=42.0,
    )
    res.final = [res.baseline, _m("mixed_precision", ("mixed_precision",), 0.1, 2.0)]  # type: ignore[list-item]
    res.combined = res.final[1]
    return res


def test_page_is_self_contained_with_four_plots():
    page = html.render(payload(_result()))
    assert page.count("<svg") == 4
    assert "<script" not in page and "&lt;script&gt;" in page  # run strings are escaped
    assert 'src="http' not in page and "<link" not in page and "@import" not in page  # nothing fetched
    assert "Recommended: mixed_precision" in page and "2.00x" in page


def test_plots_are_svg_and_deterministic():
    a = plots.throughput([{"label": "baseline", "median_s": 0.2, "q1_s": 0.19, "q3_s": 0.21, "items": 32}])
    b = plots.throughput([{"label": "baseline", "median_s": 0.2, "q1_s": 0.19, "q3_s": 0.21, "items": 32}])
    assert a.startswith("<svg") and a == b


def test_results_rows_and_apply_snippet():
    p = payload(_result())
    kinds = [r["kind"] for r in rows(p)]
    assert kinds[0] == "tune-run" and kinds[-1] == "tune-summary" and kinds.count("tune-candidate") == 3
    code = apply_snippet(p)
    compile(code, "apply.py", "exec")
    assert 'ptt.mixed_precision(device, dtype="bf16")' in code and "2.00x" in code


def test_page_opens_in_headless_chromium(tmp_path):
    import shutil
    import subprocess

    import pytest

    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("Debian package chromium is not installed (make system-deps installs it)")
    page = tmp_path / "report.html"
    page.write_text(html.render(payload(_result())), encoding="utf-8")
    shot = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1000,1400",
    ]
    dom = subprocess.run(
        [exe, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert dom.returncode == 0 and "ptt tune receipt" in dom.stdout and dom.stdout.count("<svg") == 4
    subprocess.run([exe, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
