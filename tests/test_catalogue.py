"""Contract tests over the whole catalogue: every trick has its card, export, test file and a runnable bench case."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pytorchtricks as ptt
from pytorchtricks import catalogue
from pytorchtricks.core import BenchCase, TrickInfo

ROOT = Path(__file__).resolve().parents[1]
TRICKS = catalogue.discover()
IDS = [t.name for t in TRICKS]


def test_catalogue_is_not_empty_and_names_are_unique() -> None:
    assert len(TRICKS) >= 4
    assert len(set(IDS)) == len(IDS)


def test_every_non_helper_module_in_tricks_declares_a_trick() -> None:
    for where in catalogue.WHERE:
        for path in (ROOT / "src/pytorchtricks/tricks" / where).glob("*.py"):
            if path.name.startswith("_"):
                continue
            assert path.stem in IDS, f"{path} has no TRICK = TrickInfo(...) (helpers must start with '_')"


@pytest.mark.parametrize("trick", TRICKS, ids=IDS)
def test_card_has_summary_and_sections(trick: catalogue.Trick) -> None:
    card = catalogue.parse_card(trick.card)
    assert card["summary"].endswith("."), f"{trick.name}: summary line must be a sentence"
    for section in catalogue.CARD_SECTIONS:
        assert card.get(section), f"{trick.name}: card lacks a '{section}:' section"
    assert isinstance(trick.info, TrickInfo)


@pytest.mark.parametrize("trick", TRICKS, ids=IDS)
def test_trick_is_exported_and_tested(trick: catalogue.Trick) -> None:
    assert trick.exports, f"{trick.name}: __all__ is empty"
    for name in trick.exports:
        assert getattr(ptt, name) is getattr(trick.load(), name), f"ptt.{name} is not exported"
    assert trick.name in trick.exports or trick.name + "_" in trick.exports, (
        f"{trick.name}: the main function must share the module's name (with a trailing _ if in place)"
    )
    test_file = ROOT / "tests" / "tricks" / trick.where / f"test_{trick.name}.py"
    assert test_file.exists(), f"missing {test_file.relative_to(ROOT)}"


@pytest.mark.parametrize("trick", TRICKS, ids=IDS)
def test_bench_case_smoke_runs_on_cpu(trick: catalogue.Trick) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = trick.bench_case("smoke")
        assert isinstance(case, BenchCase)
        try:
            base, treated = case.baseline(), case.treated()
            if case.check is not None:
                case.check(base, treated)
            for peer in case.peers.values():
                peer()
        finally:
            if case.cleanup is not None:
                case.cleanup()


def test_every_export_resolves() -> None:
    for name in ptt.__all__:
        assert getattr(ptt, name) is not None, name
    with pytest.raises(AttributeError):
        ptt.no_such_trick  # noqa: B018


def test_import_is_light_and_side_effect_free() -> None:
    code = (
        "import sys, torch, pytorchtricks as ptt\n"
        "heavy = [m for m in ('torchvision', 'cv2', 'lmdb', 'onnx', 'onnxruntime', 'torchao', 'matplotlib')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "print('CUDA_INIT', torch.cuda.is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout, res.stdout
    assert "CUDA_INIT False" in res.stdout, res.stdout


def test_get_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(ptt.PttError, match="Did you mean seed_everything"):
        catalogue.get("seed_everythin")


def test_select_filters_and_rejects_bad_filters() -> None:
    assert {t.where for t in catalogue.select(where="runtime")} == {"runtime"}
    assert all("memory" in t.info.gains for t in catalogue.select(gains="memory"))
    with pytest.raises(ptt.PttError, match="use one of"):
        catalogue.select(where="nowhere")
    with pytest.raises(ptt.PttError, match="use one of"):
        catalogue.select(gains="happiness")


def test_trick_info_rejects_unknown_gains() -> None:
    with pytest.raises(ValueError, match="gains"):
        TrickInfo(gains=("magic",), phase=("train",), exact=True)
    with pytest.raises(ValueError, match="phase"):
        TrickInfo(gains=("speed",), phase=("deploy",), exact=True)
