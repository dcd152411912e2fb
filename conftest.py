"""Doctest namespace (repo root, so it covers src/ doctests and tests/): examples may use `torch`, `nn`, `np` and `ptt` without importing them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict[str, Any]) -> None:
    import pytorchtricks

    doctest_namespace.update({"torch": torch, "nn": nn, "np": np, "ptt": pytorchtricks})
