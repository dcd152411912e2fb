"""The catalogue's tune hooks as candidates: which tricks ``tune`` can apply, found by enumerating the catalogue.

A candidate is a catalogue trick whose module declares ``TUNE = TuneHook(...)`` (``pytorchtricks.tunable``), or one
of its variants (``pack[resize]``). Nothing under ``tune/`` names a trick: a new trick with a hook is a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytorchtricks import catalogue
from pytorchtricks.tunable import TuneHook


@dataclass(frozen=True)
class Candidate:
    """One way ``tune`` can apply a catalogue trick."""

    name: str  # the catalogue trick's name, with [variant] for a second hook of the same trick
    trick: str
    hook: TuneHook
    phases: tuple[str, ...]
    exact: bool
    gains: tuple[str, ...]
    needs: tuple[str, ...] = ()

    @property
    def scope(self) -> str:
        return self.hook.scope

    @property
    def requires(self) -> tuple[str, ...]:
        return self.hook.requires


def all_candidates() -> tuple[Candidate, ...]:
    """Every tune hook in the catalogue, in (application order, name) order."""
    out = []
    for t in catalogue.discover():
        hooks = getattr(t.load(), "TUNE", None)
        if hooks is None:
            continue
        for hook in hooks if isinstance(hooks, tuple) else (hooks,):
            if not isinstance(hook, TuneHook):
                raise TypeError(f"{t.module}.TUNE must be a TuneHook or a tuple of them")
            name = f"{t.name}[{hook.variant}]" if hook.variant else t.name
            exact = t.info.exact and hook.check != "approximate"
            out.append(Candidate(name, t.name, hook, t.info.phase, exact, t.info.gains, t.info.needs))
    return tuple(sorted(out, key=lambda c: (c.hook.order, c.name)))


def by_name(name: str) -> Candidate:
    for c in all_candidates():
        if c.name == name:
            return c
    raise KeyError(name)


def with_requirements(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` plus what they require (``cache_in_ram`` -> ``make_loader`` too), in application order."""
    want = set(names)
    for n in names:
        want.update(by_name(n).requires)
    return tuple(c.name for c in all_candidates() if c.name in want)
