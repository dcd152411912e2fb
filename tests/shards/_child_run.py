"""Run a driver script in a child interpreter over this checkout's ``src`` and read the JSON its last line prints
(the kill-and-resume tests drive ``ptt pack`` this way, so a SIGKILL takes the child, not pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def child_env(**extra: str) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def run_driver(driver: str, arg: dict[str, Any], timeout_s: float = 300, **env: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-c", driver, json.dumps(arg)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=child_env(**env),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
