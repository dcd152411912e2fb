"""`ptt doctor script`: the rules on a planted and a clean script, the safe rewrites, the command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytorchtricks.analysis.script_rules import RULES, check_script, rewrite_script
from pytorchtricks.cli import main
from pytorchtricks.core import PttError

pytest.importorskip("libcst")
SCRIPTS = Path(__file__).parent / "scripts"
PLANTED = (SCRIPTS / "train_planted.py").read_text(encoding="utf-8")
CLEAN = (SCRIPTS / "train_clean.py").read_text(encoding="utf-8")


def test_every_planted_pattern_is_found_with_its_line():
    found = check_script(PLANTED)
    ids = {f.id for f in found}
    assert ids == set(RULES) - {"PTS003"}  # non_blocking without pinning: the planted script pins (below)
    lines = PLANTED.splitlines()
    for f in found:
        assert 1 <= f.line <= len(lines) and f.why and f.fix
    by_id = {f.id: lines[f.line - 1] for f in found}
    assert "torch.load(args.resume)" in by_id["PTS007"] and "set_to_none=False" in by_id["PTS009"]
    assert "DataParallel" in by_id["PTS006"] and ".item()" in by_id["PTS004"]


def test_the_clean_script_has_no_finding():
    assert check_script(CLEAN) == []


def test_small_cases_and_no_false_findings():
    periodic = (
        "for i, (x, y) in enumerate(loader):\n    loss = f(x, y)\n    loss.backward()\n"
        "    if i % 10 == 0:\n        print(loss.item())\n"
    )
    assert check_script(periodic) == []  # a read every K steps is the fix, not the problem
    every = "for x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    total += loss.item()\n"
    assert [f.id for f in check_script(every)] == ["PTS004"]
    eval_loop = "for x, y in loader:\n    acc += (model(x).argmax(1) == y).float().mean().item()\n"
    assert check_script(eval_loop) == []  # no backward: not the training loop
    unpinned = (
        "loader = DataLoader(ds, num_workers=4)\nfor x, y in loader:\n    x = x.to(d, non_blocking=True)\n"
    )
    assert [f.id for f in check_script(unpinned)] == ["PTS003"]
    assert check_script("torch.load(p, weights_only=True)\n") == []
    assert [f.id for f in check_script("torch.load(p, weights_only=False)\n")] == ["PTS007"]


def test_rewrite_keeps_comments_and_formatting():
    src = "import torch\n\n# resume\nsd = torch.load(  path )  # keep me\nopt.zero_grad(set_to_none=False)\n"
    out = rewrite_script(src)
    assert (
        out
        == "import torch\n\n# resume\nsd = torch.load(  path, weights_only=True )  # keep me\nopt.zero_grad()\n"
    )
    assert rewrite_script(out) == out and check_script(out) == []


def _photos(root: Path) -> str:
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(2):
        (root / f"c{k}").mkdir(parents=True)
        for j in range(8):
            Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(
                root / f"c{k}" / f"{j}.jpg"
            )
    return str(root)


def _losses(script: Path, data: str, resume: str) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(
        [sys.executable, str(script), data, "-j", "0", "--steps", "3", "--resume", resume],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return re.findall(r"step \d+ loss [0-9.]+", r.stdout)


@pytest.mark.slow
def test_fixed_script_runs_to_the_same_losses(tmp_path):
    """The rewrites are exact: 3 seeded steps give the same losses before and after --fix (and the resumed
    checkpoint loads with weights_only=True)."""
    import torch
    import torchvision

    data = _photos(tmp_path / "photos")
    torch.manual_seed(1)
    ckpt = str(tmp_path / "resnet.pt")
    torch.save(torchvision.models.resnet18(num_classes=2).state_dict(), ckpt)
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "train_planted.py", script)
    before = _losses(script, data, ckpt)
    assert main(["doctor", "script", str(script), "--fix"]) == 0
    fixed = script.read_text(encoding="utf-8")
    assert (tmp_path / "train.py.orig").read_text(encoding="utf-8") == PLANTED  # nothing lost
    assert "weights_only=True" in fixed and "torch.amp.GradScaler(" in fixed
    assert {f.id for f in check_script(fixed)} == {f.id for f in check_script(PLANTED) if not f.fixable}
    after = _losses(script, data, ckpt)
    assert len(before) == 3 and before == after


def test_command_line_reports_diffs_and_refuses_bad_input(tmp_path, capsys):
    script = tmp_path / "t.py"
    script.write_text("import torch\nsd = torch.load(p)\n", encoding="utf-8")
    assert main(["doctor", "script", str(script), "--diff"]) == 0
    out = capsys.readouterr().out
    assert "PTS007" in out and "+sd = torch.load(p, weights_only=True)" in out
    assert script.read_text(encoding="utf-8") == "import torch\nsd = torch.load(p)\n"  # --diff writes nothing
    assert main(["doctor", "script", str(tmp_path / "missing.py")]) != 0
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "bad.py").write_text("def f(:\n", encoding="utf-8")
    assert main(["doctor", "script", str(tmp_path / "bad.py")]) != 0
    assert "does not parse" in capsys.readouterr().err
    with pytest.raises(PttError, match="does not parse"):
        check_script("def f(:\n")
