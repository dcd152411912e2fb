"""core.config_first: a verb's options as its config or its fields as keywords, never both, checked the same everywhere."""

from __future__ import annotations

import dataclasses
import inspect

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


def test_options_of_shows_the_config_fields_in_the_signature() -> None:
    from pytorchtricks.core import options_of

    @options_of(_Needs)
    def verb(x: int, config: _Needs | None = None, **options: object) -> _Needs:
        return config_first(config, _Needs, options)

    params = inspect.signature(verb).parameters
    assert list(params) == ["x", "config", "root", "seed"]
    assert params["root"].default is inspect.Parameter.empty and params["seed"].default == 0
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ("root", "seed"))
    assert verb(1, root="r") == _Needs("r")  # the call is unchanged


def test_every_verb_on_config_first_takes_options_and_shows_them() -> None:
    """One convention: a function that calls ``config_first(config, X, options)`` takes ``**options`` and is marked
    ``@options_of(X)``, so its keywords are X's fields, checked and shown from the one declaration."""
    import ast
    from pathlib import Path

    import pytorchtricks

    wrong, seen = [], 0
    for path in sorted(Path(pytorchtricks.__file__).parent.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef) or fn.name == "config_first":
                continue
            calls = [
                c
                for c in ast.walk(fn)
                if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "config_first"
            ]
            if not calls:
                continue
            seen += 1
            cls = ast.unparse(calls[0].args[1])
            marks = [ast.unparse(d) for d in fn.decorator_list]
            if f"options_of({cls})" not in marks or fn.args.kwarg is None or fn.args.kwarg.arg != "options":
                wrong.append(f"{path.name}:{fn.lineno} {fn.name} ({cls})")
    assert seen >= 14 and not wrong, wrong
