"""core.config_first: a verb's options as its config or its fields as keywords, never both, checked the same everywhere."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pytorchtricks.core import PttError, config_first


@dataclasses.dataclass(frozen=True, eq=False)
class _Options:
    table: np.ndarray | None = None
    names: tuple[str, ...] = dataclasses.field(default_factory=tuple)
    shard_size: int | str = "64MB"


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
