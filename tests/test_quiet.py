"""A good run writes nothing alarming: no Kineto USDT markers, no "ERROR" of a missing CUDA driver, no traceback.

``quiet.filtered_stderr`` drops exactly the known harmless C++ lines at file descriptor 2 and keeps the rest; the
CPU peak meter starts no Kineto; ``ptt tune`` and ``ptt profile`` run in a subprocess (a fresh process, as a user
starts them) and their whole terminal output is checked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.clock import cpu_tracked_peak_bytes
from pytorchtricks.quiet import filtered_stderr, is_noise

ALARM = re.compile(r"ERROR|USDT|Traceback")

MODELS = """
from torch import nn


def tiny():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
"""


def test_known_noise_is_dropped_and_everything_else_kept(capfd):
    with filtered_stderr():
        os.write(2, b"USDT:2026-12-01 10:03:53 1:1 SyncActivityProfilerHandler.cpp:39] profiler_start\n")
        os.write(
            2,
            b"ERROR:2026-12-01 10:03:53 1:1 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n",
        )
        os.write(2, b"real problem: keep me\n")
        os.write(
            2,
            b"[W1201 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling\n",
        )
        print("python warning text", file=sys.stderr)
    err = capfd.readouterr().err
    # (under pytest, sys.stderr is its capture object, not descriptor 2: compare the lines, not their order)
    assert sorted(err.splitlines()) == ["python warning text", "real problem: keep me"]
    assert not is_noise(b"ERROR: out of memory")


def test_quiet_peak_meter_agrees_with_the_profiler_meter_and_prints_no_kineto_lines(capfd):
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)

    def step() -> None:
        lin.zero_grad(set_to_none=True)
        lin(x).relu().sum().backward()

    step()
    capfd.readouterr()
    ours = quiet_peak_memory(step)
    assert capfd.readouterr().err == ""  # no USDT / ERROR / unknown-size lines reach the terminal
    assert ours.method == "cpu_tracked" and ours.peak_bytes == cpu_tracked_peak_bytes(step) > 0


def _run(args: list[str], cwd: str) -> str:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "pytorchtricks.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
def test_tune_and_profile_write_nothing_alarming(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    spec = f"{tmp_path / 'models.py'}:tiny"
    out = _run(
        ["tune", "--model", spec, "--data", "synthetic", "--input-size", "16", "--batch-size", "8",
         "--time-budget", "12", "--out", str(tmp_path / "receipt")],
        str(tmp_path),
    )  # fmt: skip
    assert "recommended:" in out or "no recommendation:" in out  # a busy machine is said, not hidden
    assert not ALARM.search(out), [line for line in out.splitlines() if ALARM.search(line)]
    out = _run(
        ["profile", spec, "--input-shape", "4,3,16,16", "--steps", "2", "--profile-steps", "1"], str(tmp_path)
    )
    assert "top ops" in out
    assert not ALARM.search(out), [line for line in out.splitlines() if ALARM.search(line)]
