"""tune never gives a confident wrong answer (issue 29): a busy machine is seen, figures check themselves, the
CPU-seconds of the job are accounted, and the budget is spent. The logic is pinned with injected timings and loads;
the mechanism (who used the CPU) with real processes. No test here asserts a speed."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading

import pytest

from pytorchtricks.analysis import verdict as judge
from pytorchtricks.clock import CpuMeter, CpuUse
from pytorchtricks.tune import diagnose as diag_mod
from pytorchtricks.tune.engine import measuring_share, no_recommendation, tune_model, wait_for_quiet
from pytorchtricks.tune.measuring import TuneResult
from pytorchtricks.tune.workload import build_workload

BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def cpu_burner():
    """``start(n, seconds)``: n processes that each spin on a core - *other* programs, not this job's (started
    through a shell that exits at once, so they are not descendants of the test process); stopped after the test,
    and each ends by itself after ``seconds`` anyway."""
    pids: list[int] = []

    def start(n: int, seconds: float = 120.0) -> None:
        for _ in range(n):
            code = BURN.format(s=seconds)
            out = subprocess.run(
                ["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', code],
                capture_output=True,
                text=True,
                check=True,
            )
            pids.append(int(out.stdout.strip()))

    yield start
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _use(**kw) -> CpuUse:
    base = dict(
        wall_s=10.0,
        cores=2,
        machine_cores=2,
        main_cpu_s=15.0,
        workers_cpu_s=0.0,
        others_cpu_s=0.0,
        steal_s=0.0,
    )
    return CpuUse(**(base | kw))


def _spin(seconds: float) -> None:
    exec(BURN.format(s=seconds))


def _burn_cpu(cpu_s: float) -> None:
    """Spend ``cpu_s`` of CPU time (not wall time: a loaded machine only makes it take longer)."""
    import time

    while time.process_time() < cpu_s:
        pass


# -- the mechanism: who used the CPU


def test_cpu_meter_tells_our_workers_from_other_programs(cpu_burner):
    cpu_burner(1, seconds=20)
    child = mp.get_context("fork").Process(target=_burn_cpu, args=(1.0,))
    with CpuMeter() as m:
        child.start()
        child.join()
        threading.Event().wait(0.5)
    u = m.result
    assert u is not None and u.wall_s >= 1.0
    # our child: ours, not another program's (the time since the sampler's last look before it exited is lost)
    assert u.workers >= 1 and u.workers_cpu_s >= 1.0 - 2 * 0.2 - 0.02
    assert u.others_cpu_s >= 0.4 * u.wall_s  # the burner: another program (it shares 2 cores with our child)
    assert any(t["name"].startswith("python") for t in u.top_others)
    d = u.as_dict()
    assert 0 < d["busy_share"] <= 1.0 and d["others_cores"] > 0


# -- a busy machine


def test_a_busy_phase_is_flagged_and_a_quiet_one_is_not():
    assert judge.machine_busy(_use(others_cpu_s=10.0), threads=2)  # a whole core of the two the step needs
    assert judge.machine_busy(_use(others_cpu_s=0.5), threads=2) is None  # 0.05 cores: noise
    # one thread on two cores leaves a core spare: a neighbour on it does not stall the step
    assert judge.machine_busy(_use(others_cpu_s=9.0), threads=1) is None
    assert judge.machine_busy(_use(others_cpu_s=14.0), threads=1)
    said = judge.machine_busy(
        _use(others_cpu_s=10.0, top_others=[{"name": "pip", "pid": 7, "cpu_s": 9.5}]), threads=2
    )
    assert said and "pip (pid 7" in said and "50%" in said
    assert judge.machine_busy(None, threads=2) is None


def test_waiting_for_the_load_to_drop():
    looks = iter([_use(others_cpu_s=10.0), _use(others_cpu_s=10.0), _use(others_cpu_s=0.2)])
    quiet, _ = wait_for_quiet(10.0, 2, look=lambda: next(looks))
    assert quiet
    busy = _use(others_cpu_s=10.0)
    calls = []
    quiet, _ = wait_for_quiet(6.0, 2, look=lambda: calls.append(1) or busy)
    assert not quiet and len(calls) == 3  # 6 s of 2-second looks, then it gives up


def test_an_unreliable_run_never_says_keep_the_current_setup():
    res = TuneResult(workload={}, env={}, goal="speed", budget_s=60)
    assert "keep the current setup" in no_recommendation(res)
    res.unreliable = ["the machine was busy while tune measured (measure): other processes took 50% ..."]
    said = no_recommendation(res)
    assert "keep" not in said and "unreliable" in said and "quiet machine" in said


# -- figures that check themselves


def test_a_staged_step_timed_with_our_workers_alive_is_refused():
    with pytest.raises(diag_mod.WorkersAlive, match="refused"):
        diag_mod.staged_alone(_use(wall_s=1.0, workers_cpu_s=0.8, workers=2))
    diag_mod.staged_alone(_use(wall_s=1.0, workers_cpu_s=0.01, workers=2))  # an idle worker exiting: fine


def test_the_compute_step_is_not_timed_beside_a_running_process_of_ours(models_file):
    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=4, input_size=16, num_workers=1)
    child = mp.get_context("fork").Process(target=_spin, args=(60.0,))  # ended below, whatever the load
    child.start()
    try:
        with pytest.raises(diag_mod.WorkersAlive):
            diag_mod._staged_step_s(w, 3)
    finally:
        child.terminate()
        child.join()
    alone, use = diag_mod._staged_step_s(w, 3)  # nothing of ours running now
    assert alone is not None and alone > 0 and use is not None


def test_inconsistent_figures_are_named():
    assert (
        diag_mod.inconsistencies(1.0, 0.95, 1.05, 0.5, 0.0) == []
    )  # alone below the whole step, tight spread
    (above,) = diag_mod.inconsistencies(1.0, 0.95, 1.05, 1.4, 0.0)
    assert "slower than the whole step" in above
    # the whole step's spread puts the input share at 9%-41%: both sides of 30%
    (spread,) = diag_mod.inconsistencies(0.9, 0.55, 0.85, 0.5, 0.0)
    assert "both sides" in spread
    (gap,) = diag_mod.inconsistencies(
        1.0, 0.95, 1.05, 0.5, 0.0, wall_s=1.5
    )  # a third of each step in no stage
    assert "add up" in gap and "33%" in gap
    assert diag_mod.inconsistencies(1.0, 0.95, 1.05, 0.5, 0.0, wall_s=1.02) == []


def test_an_inconsistent_diagnosis_is_measured_again(models_file, monkeypatch):
    calls = []

    def fake(*args):
        calls.append(args)
        return ["the compute step alone (9.000 s) was slower than the whole step"] if len(calls) == 1 else []

    monkeypatch.setattr(diag_mod, "inconsistencies", fake)
    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=4, input_size=16, num_workers=0)
    d = diag_mod.diagnose(w, budget_s=4)
    assert len(calls) == 2 and d.remeasured and "slower than the whole step" in d.remeasured[0]
    assert not [u for u in d.unreliable if "slower than" in u]  # the second measurement agreed
    assert "whole step" in d.cpu and d.core_seconds is not None


def test_figures_that_stay_inconsistent_make_the_diagnosis_unreliable(models_file, monkeypatch):
    monkeypatch.setattr(diag_mod, "inconsistencies", lambda *a: ["a split that does not add up"])
    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=4, input_size=16, num_workers=0)
    d = diag_mod.diagnose(w, budget_s=4)
    assert "a split that does not add up" in d.unreliable and not d.certain
    assert d.loader_can_help  # uncertain figures do not rule the loader tricks out


# -- the CPU-seconds accounting and the one verdict


def test_a_contended_split_gets_the_contended_verdict():
    sat = judge.CoreSeconds(main_s=1.2, workers_s=0.7, cores=2, step_s=1.0)  # 95% of 2 core-s, 37% workers
    v = judge.judge(1.0, 0.05, core_seconds=sat)
    assert v.name == judge.CPU_CONTENDED and v.loader_can_help and "1.20 CPU-s" in v.evidence
    assert judge.judge(1.0, 0.05, compute_alone_s=0.5).name == judge.CPU_CONTENDED
    idle = judge.CoreSeconds(main_s=0.9, workers_s=0.6, cores=2, step_s=1.0)  # 75%: not saturated
    assert judge.judge(1.0, 0.05, core_seconds=idle).name == judge.COMPUTE_BOUND
    assert judge.judge(1.0, 0.4, core_seconds=sat).name == judge.INPUT_BOUND  # waiting comes first
    assert not judge.judge(1.0, 0.05).loader_can_help


def test_oversubscription_is_named():
    assert judge.oversubscription(2, 2, 2) and "2 training thread(s) + 2 loader worker(s)" in (
        judge.oversubscription(2, 2, 2) or ""
    )
    assert judge.oversubscription(1, 1, 2) is None


# -- the budget is spent


def test_the_measuring_share_spends_the_budget_before_saying_it_is_too_short():
    def fits_if(need_s: float):
        return lambda names, share: share >= need_s * len(names)

    assert measuring_share(["a", "b", "c"], 100.0, fits_if(10.0)) == (50.0, 3, False)
    assert measuring_share(["a", "b", "c"], 100.0, fits_if(20.0)) == (50.0, 2, False)
    share, n, forced = measuring_share(["a", "b"], 100.0, fits_if(60.0))  # one fits only in (almost) all
    assert (n, forced) == (1, False) and share == pytest.approx(95.0)
    share, n, forced = measuring_share(["a", "b"], 100.0, fits_if(150.0))  # the minimum run, past the budget
    assert (n, forced) == (1, True)
    assert measuring_share(["a"], 100.0, fits_if(300.0))[1] == 0  # hopeless: more than twice what is left


# -- end to end, with another program holding the cores


@pytest.mark.slow
def test_tune_on_a_busy_machine_says_so_and_records_busy_per_phase(tmp_path, models_file, cpu_burner):
    cpu_burner(len(os.sched_getaffinity(0)), seconds=90)  # every core the job may use: the step's thread too
    out = str(tmp_path / "out")
    res = tune_model(
        f"{models_file}:tiny", "synthetic", batch_size=8, input_size=16, time_budget_s=20, out=out
    )
    assert res.unreliable and any("busy" in u for u in res.unreliable)
    assert all("busy_share" in d for d in res.cpu.values()) and res.cpu["diagnose"]["busy_share"] > 0.2
    assert res.phase_s and sum(res.phase_s.values()) <= res.elapsed_s + 1
    from pytorchtricks.tune.console import summary_lines

    text = "\n".join(summary_lines(res, out))
    assert "keep the current setup" not in text and "CPU taken by other processes, per phase" in text
    assert f"verdict: [bold]{res.diagnosis.verdict}[/] - " in text and "CPU-s" in text  # with its CPU-seconds
    with open(os.path.join(out, "results.jsonl"), encoding="utf-8") as fh:
        run = json.loads(fh.readline())
    assert run["kind"] == "tune-run" and run["unreliable"]
    assert {"busy_share", "others_cores", "main_cpu_s", "workers_cpu_s"} <= set(run["cpu"]["diagnose"])
    with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
        html = fh.read()
    assert "Unreliable figures" in html and "keep the current setup" not in html


# -- the accelerator's step, declared (--device-step-ms)


def test_a_declared_step_holds_the_process_and_leaves_model_tricks_out(models_file, jpeg_folder):
    from pytorchtricks.core import PttError
    from pytorchtricks.tunable import TuneFacts
    from pytorchtricks.tune.candidates import why_not
    from pytorchtricks.tune.hooks import by_name

    with pytest.raises(PttError, match="milliseconds"):
        build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=4, input_size=16, device_step_ms=-1)
    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=4, input_size=16, device_step_ms=40)
    assert w.device_step_s == pytest.approx(0.04) and any("projection" in n for n in w.notes)
    d = diag_mod.diagnose(w, budget_s=4)
    assert set(d.split_s) == {"data wait", "device step (declared)"}
    assert d.split_s["device step (declared)"] == pytest.approx(0.04, rel=0.5)
    assert d.compute_alone_s is not None and d.compute_alone_s >= 0.04  # the staged step is the declared one
    # the stand-in step uses no core: the training process's CPU per step is far below the step's wall time
    assert d.core_seconds is not None and d.core_seconds["main_cpu_s_per_step"] < 0.5 * d.step_s
    facts = TuneFacts(verdict="input-bound", data_kind="files", declared_step_s=0.04, has_conv2d=True)
    assert "declared" in (why_not(by_name("to_channels_last"), facts) or "")
    assert why_not(by_name("make_loader"), facts) is None  # loaders are what is projected
