"""core.config_or_keywords: a verb's options as its config or its keywords, never both, checked the same everywhere."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pytorchtricks.core import PttError, config_first, config_or_keywords


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


def test_config_first_takes_the_config_or_its_fields_as_keywords() -> None:
    cfg = _Options(shard_size=5)
    assert config_first(cfg, _Options, {}) is cfg
    built = config_first(None, _Options, {"shard_size": 7, "names": ("a",)})
    assert isinstance(built, _Options) and (built.shard_size, built.names) == (7, ("a",))
    with pytest.raises(PttError, match=r"not both \(got shard_size too\)"):
        config_first(
            cfg, _Options, {"shard_size": "64MB"}
        )  # even a default's value: a keyword beside a config
    with pytest.raises(PttError, match="unknown option 'shardsize': did you mean 'shard_size'"):
        config_first(None, _Options, {"shardsize": 7})
    with pytest.raises(
        PttError, match=r"unknown option 'zzz': the options are _Options's fields \(table, names"
    ):
        config_first(None, _Options, {"zzz": 7})
    with pytest.raises(PttError, match="config must be a _Options, not str"):
        config_first("64MB", _Options, {})  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class _Needs:
    root: str
    seed: int = 0


def test_config_first_says_what_is_missing() -> None:
    with pytest.raises(PttError, match="missing root: pass them as keywords, or pass a _Needs"):
        config_first(None, _Needs, {"seed": 1})
    assert config_first(None, _Needs, {"root": "x"}) == _Needs("x")
