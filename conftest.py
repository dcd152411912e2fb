"""Doctest namespace (repo root, so it covers src/ doctests and tests/): examples may use `torch`, `nn`, `np` and `ptt` without importing them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict[str, Any]) -> None:
    import pytorchtricks

    doctest_namespace.update({"torch": torch, "nn": nn, "np": np, "ptt": pytorchtricks})


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread (``pytestmark = pytest.mark.usefixtures("one_thread")``): on a shared 2-core machine,
    oversubscribed OpenMP threads make small ops stall on spin-waits (10-50x slower)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def run_threads() -> Any:
    """``run_threads(target, n)``: start ``n`` threads on ``target``, join them all, return what they raised (a
    thread's exception would otherwise be lost)."""
    import threading

    def run(target: Any, n: int) -> list[BaseException]:
        errors: list[BaseException] = []

        def guarded() -> None:
            try:
                target()
            except BaseException as exc:  # surfaced to the test through the returned list
                errors.append(exc)

        threads = [threading.Thread(target=guarded) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    return run
