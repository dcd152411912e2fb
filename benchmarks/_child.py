"""The benchmarks' one way to time a system in a child interpreter (its own environment: the core venv or a peer's)
and read back its result: the child prints one ``__RESULT__{json}`` line (``emit``), the parent runs it and parses
that line or says why there is none (``run_child``)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

MARK = "__RESULT__"


def emit(result: Any) -> None:
    """The child's last word: its result as one marked JSON line on stdout."""
    print(MARK + json.dumps(result))


def run_child(cmd: list[str], timeout_s: float, cwd: str, error_chars: int = 300) -> dict[str, Any]:
    """Run ``cmd`` and return the result it emitted, or ``{"error": ...}``: a timeout, or the last line of its
    stderr (at most ``error_chars`` characters)."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if res.returncode == 0 and MARK in res.stdout:
        return dict(json.loads(res.stdout.rsplit(MARK, 1)[1]))
    return {"error": (res.stderr.strip().splitlines() or ["failed"])[-1][:error_chars]}
