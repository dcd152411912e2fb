"""The trick catalogue: discovered from the ``tricks/`` tree, which is the registry.

A trick is a module ``tricks/<where>/<name>.py`` (``where`` in data, loop, model, runtime) that defines
``TRICK = TrickInfo(...)``, a card (its module docstring), its public function(s) in ``__all__`` and
``bench_case(size)``. Modules whose name starts with ``_`` are helpers, not tricks.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

from pytorchtricks.core import BenchCase, PttError, TrickInfo

WHERE: tuple[str, ...] = ("data", "loop", "model", "runtime")
CARD_SECTIONS: tuple[str, ...] = ("Why", "When", "Caveats", "See also")


@dataclass(frozen=True)
class Trick:
    """One catalogue entry."""

    name: str
    where: str
    module: str
    info: TrickInfo
    card: str
    exports: tuple[str, ...]

    @property
    def summary(self) -> str:
        return self.card.strip().splitlines()[0].strip() if self.card.strip() else ""

    def section(self, title: str) -> str:
        """Text of one card section (``Why``, ``When``, ``Caveats``, ``See also``), or ``""``."""
        return parse_card(self.card).get(title, "")

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def bench_case(self, size: str = "smoke") -> BenchCase:
        mod = self.load()
        if not hasattr(mod, "bench_case"):
            raise PttError(f"trick {self.name!r} has no bench_case(); it cannot be benchmarked.")
        case = mod.bench_case(size)
        if not isinstance(case, BenchCase):
            raise TypeError(f"{self.module}.bench_case must return a BenchCase, got {type(case).__name__}")
        return case


def parse_card(card: str) -> dict[str, str]:
    """Split a card docstring into its sections; the first line is returned under ``"summary"``.

    Example:
        >>> parse_card("Do X.\\n\\nWhy: fast.\\nWhen: always.\\n")["When"]
        'always.'
    """
    lines = card.strip().splitlines()
    out: dict[str, str] = {"summary": lines[0].strip() if lines else ""}
    current: str | None = None
    pattern = re.compile(r"^(" + "|".join(re.escape(s) for s in CARD_SECTIONS) + r"):\s*(.*)$")
    for line in lines[1:]:
        m = pattern.match(line.strip())
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current and line.strip():
            out[current] = (out[current] + " " + line.strip()).strip()
        elif current and not line.strip():
            current = None
    return out


def _iter_trick_modules() -> list[tuple[str, str]]:
    found = []
    for where in WHERE:
        pkg = importlib.import_module(f"pytorchtricks.tricks.{where}")
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_") and not info.ispkg:
                found.append((where, f"pytorchtricks.tricks.{where}.{info.name}"))
    return sorted(found, key=lambda t: (t[0], t[1]))


@lru_cache(maxsize=1)
def discover() -> tuple[Trick, ...]:
    """Import every trick module once and return the catalogue, sorted by (where, name)."""
    tricks = []
    for where, modname in _iter_trick_modules():
        mod = importlib.import_module(modname)
        info = getattr(mod, "TRICK", None)
        if not isinstance(info, TrickInfo):
            continue
        name = modname.rsplit(".", 1)[1]
        exports = tuple(getattr(mod, "__all__", ()))
        tricks.append(
            Trick(name=name, where=where, module=modname, info=info, card=mod.__doc__ or "", exports=exports)
        )
    return tuple(tricks)


def names() -> list[str]:
    return [t.name for t in discover()]


def get(name: str) -> Trick:
    """Look a trick up by name (module name, or any of its exported function names).

    Raises:
        PttError: unknown name, with the closest matches.
    """
    for t in discover():
        if name == t.name or name in t.exports:
            return t
    close = difflib.get_close_matches(name, names(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise PttError(f"unknown trick {name!r}.{hint} Run `ptt list` to see all tricks.")


def select(where: str | None = None, gains: str | None = None, phase: str | None = None) -> list[Trick]:
    """Filter the catalogue by where the trick acts, what it gains and the phase it applies to."""
    if where is not None and where not in WHERE:
        raise PttError(f"unknown --where {where!r}; use one of {', '.join(WHERE)}.")
    valid_gains = ("speed", "memory", "reproducibility", "accuracy")
    if gains is not None and gains not in valid_gains:
        raise PttError(f"unknown --gains {gains!r}; use one of {', '.join(valid_gains)}.")
    out = []
    for t in discover():
        if where and t.where != where:
            continue
        if gains and gains not in t.info.gains:
            continue
        if phase and phase not in t.info.phase:
            continue
        out.append(t)
    return out


def to_markdown(tricks: list[Trick] | None = None) -> str:
    """The catalogue as a Markdown table (``ptt list --markdown``; the docs' catalogue page opens with it)."""
    rows = [
        "| trick | where | gains | phase | exact | needs | what it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in tricks if tricks is not None else list(discover()):
        rows.append(
            f"| `{t.name}` | {t.where} | {', '.join(t.info.gains)} | {', '.join(t.info.phase)} | "
            f"{'yes' if t.info.exact else 'no'} | {', '.join(t.info.needs) or '-'} | {t.summary} |"
        )
    return "\n".join(rows) + "\n"
