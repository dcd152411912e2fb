"""core.config_or_keywords: a verb's options as its config or its keywords, never both, checked the same everywhere."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pytorchtricks.core import PttError, config_or_keywords


@dataclasses.dataclass(frozen=True, eq=False)
class _Options:
    table: np.ndarray | None = None
    names: tuple[str, ...] = dataclasses.field(default_factory=tuple)
    shard_size: int | str = "64MB"


def test_a_keyword_equal_to_its_default_is_not_given() -> None:
    cfg = _Options(shard_size=5)
    same = {"table": None, "names": (), "shard_size": "64MB"}
    assert config_or_keywords(cfg, _Options, same) is cfg
    built = config_or_keywords(None, _Options, {**same, "shard_size": 7})
    assert isinstance(built, _Options) and built.shard_size == 7


def test_arrays_and_factory_defaults_count_as_given() -> None:
    given = {"table": np.zeros(3), "names": ("a",), "shard_size": "64MB"}
    with pytest.raises(PttError, match=r"not both \(got names, table too\)"):
        config_or_keywords(_Options(), _Options, given)


def test_a_config_of_another_type_is_refused() -> None:
    with pytest.raises(PttError, match="config must be a _Options, not str"):
        config_or_keywords("64MB", _Options, {"table": None, "names": (), "shard_size": "64MB"})
