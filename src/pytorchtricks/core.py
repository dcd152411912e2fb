"""Shared vocabulary of the catalogue: trick metadata, bench cases, warnings and errors.

Everything here is dependency-free (torch is imported lazily by callers), so any layer may import it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

Size = Literal["smoke", "full"]
Gain = Literal["speed", "memory", "reproducibility", "accuracy"]
Phase = Literal["train", "infer"]

SIZES: tuple[str, ...] = ("smoke", "full")

C = TypeVar("C")


@dataclass(frozen=True)
class TrickInfo:
    """Catalogue metadata of one trick, declared as ``TRICK = TrickInfo(...)`` in its module.

    Attributes:
        gains: what the trick buys: ``"speed"``, ``"memory"``, ``"reproducibility"`` or ``"accuracy"``.
        phase: where it applies: ``"train"`` and/or ``"infer"``.
        exact: True when outputs are bit-for-bit or tolerance-equal to the untreated path.
        needs: requirements beyond the core install: ``"cuda"`` or the name of an extra (``"data"``, ``"infer"``).
    """

    gains: tuple[str, ...]
    phase: tuple[str, ...]
    exact: bool
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [g for g in self.gains if g not in ("speed", "memory", "reproducibility", "accuracy")]
        if bad or not self.gains:
            raise ValueError(
                f"TrickInfo.gains must name speed/memory/reproducibility/accuracy, got {self.gains}"
            )
        if not self.phase or any(p not in ("train", "infer") for p in self.phase):
            raise ValueError(f"TrickInfo.phase must be train and/or infer, got {self.phase}")


@dataclass
class BenchCase:
    """What ``bench_case(size)`` returns: the untreated and treated callables, measured by ``bench/``.

    The trick builds the inputs once; ``clock.py`` calls ``baseline`` and ``treated`` interleaved.
    ``items_per_call`` turns seconds into a throughput (images, samples, steps). ``peers`` holds optional
    third-party implementations of the same work, measured in the same rounds. ``check``, when set, is called
    once with the outputs of baseline and treated and raises if they disagree (exactness at bench time).
    ``cleanup`` restores any process-wide state after measuring.
    """

    baseline: Callable[[], Any]
    treated: Callable[[], Any]
    items_per_call: int = 1
    unit: str = "calls"
    device: str = "cpu"
    description: str = ""
    peers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    check: Callable[[Any, Any], None] | None = None
    cleanup: Callable[[], None] | None = None


class PttError(Exception):
    """Base class of errors raised by pytorchtricks on bad input; the message always says how to fix it.

    A message that names an option is a ``Spelt`` (``str(err)`` reads it as Python, ``for_cli(err)`` as the command
    line: ``split='val2017'`` there is ``--split val2017`` here)."""


_NO_VALUE: Any = object()


@dataclass(frozen=True)
class Option:
    """An option a message names, spelt where it is read: the keyword in Python (``split='val2017'``), the flag on
    the command line (``--split val2017``; ``flag`` when the CLI's name is not the keyword's with dashes).

    Example:
        >>> o = Option("split", "val2017"); o.python(), o.cli()
        ("split='val2017'", '--split val2017')
        >>> Option("num_workers", flag="--workers").cli()
        '--workers'
    """

    name: str
    value: Any = _NO_VALUE  # without one, the option alone: ``split`` / ``--split``
    flag: str | None = None

    def python(self) -> str:
        return self.name if self.value is _NO_VALUE else f"{self.name}={self.value!r}"

    def cli(self) -> str:
        import shlex

        flag = self.flag or "--" + self.name.replace("_", "-")
        return flag if self.value is _NO_VALUE else f"{flag} {shlex.quote(str(self.value))}"


class Spelt(str):
    """A message that names options (``Option``), as a ``str``: its text is the Python spelling; ``cli()`` is the
    same message as the command line spells it. The fields are ``str.format`` fields of ``template``.

    Example:
        >>> m = Spelt("coco/ holds 2 splits; pass {split}", split=Option("split", "val2017"))
        >>> str(m)
        "coco/ holds 2 splits; pass split='val2017'"
        >>> m.cli()
        'coco/ holds 2 splits; pass --split val2017'
    """

    template: str
    fields: dict[str, Any]

    def __new__(cls, template: str, **fields: Any) -> Spelt:
        self = super().__new__(cls, cls._render(template, fields, "python"))
        self.template, self.fields = template, fields
        return self

    @staticmethod
    def _render(template: str, fields: Mapping[str, Any], how: str) -> str:
        if not fields:
            return template
        return template.format(
            **{k: getattr(v, how)() if isinstance(v, Option | Spelt) else v for k, v in fields.items()}
        )

    def python(self) -> str:
        return str.__str__(self)

    def cli(self) -> str:
        return self._render(self.template, self.fields, "cli")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by its template (an error crossing a worker's pipe)
        return (_spelt, (self.template, self.fields))


def _spelt(template: str, fields: dict[str, Any]) -> Spelt:
    return Spelt(template, **fields)


def for_cli(message: Any) -> str:
    """A message (an exception, a warning, a ``Spelt`` or any text) as the command line prints it: the options it
    names as flags.

    Example:
        >>> for_cli(PttError(Spelt("pass {split}", split=Option("split", "val2017"))))
        'pass --split val2017'
    """
    if isinstance(message, BaseException) and len(message.args) == 1 and isinstance(message.args[0], Spelt):
        message = message.args[0]
    return message.cli() if isinstance(message, Spelt) else str(message)


class MissingExtraError(PttError, ImportError):
    """An optional dependency is not installed."""


class NoEffectWarning(UserWarning):
    """A trick was applied but changed nothing (e.g. no Conv->BN pair to fuse)."""


class PttWarning(UserWarning):
    """A notice: the call did what was asked, with a consequence worth knowing (samples dropped every epoch, an
    arena left in ``/dev/shm``). Silence it with ``warnings.filterwarnings("ignore", category=ptt.PttWarning)``."""


def require(module: str, extra: str, *, package: str | None = None) -> Any:
    """Import an optional dependency or raise ``MissingExtraError`` naming the extra to install.

    Example:
        >>> require("math", "core").sqrt(4.0)
        2.0
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = package or module.split(".")[0]
        raise MissingExtraError(
            f"{pkg} is not installed; install it with `pip install 'pytorchtricks[{extra}]'` (or `pip install {pkg}`)."
        ) from exc


def cache_root(*parts: str) -> str:
    """The one folder for what the library generates and keeps between runs (built-in data sets, compiled shims,
    trained reference models, the node's shard cache, tune's packs): ``$PTT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/pytorchtricks``, else ``~/.cache/pytorchtricks``; ``parts`` name a sub-folder of it.

    Example:
        >>> import os; os.environ["PTT_CACHE_DIR"] = "/tmp/c"; cache_root("shards")
        '/tmp/c/shards'
        >>> del os.environ["PTT_CACHE_DIR"]
    """
    import os

    base = os.environ.get("PTT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pytorchtricks"
    )
    return os.path.join(base, *parts)


def resolve_device(device: str | Any | None) -> Any:
    """Turn ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` into a ``torch.device``, or fail clearly.

    ``None`` picks CUDA when available, else CPU.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise PttError(f"unknown device {device!r}; use 'cpu' or 'cuda' (optionally 'cuda:N').") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PttError("device 'cuda' was asked for but no CUDA device is available; use --device cpu.")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise PttError(f"unsupported device {device!r}; use 'cpu' or 'cuda'.")
    return dev


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def config_first(config: C | None, cls: type[C], options: Mapping[str, Any]) -> C:
    """A verb's options, config first: its ``config``, or a ``cls`` built from its ``**options`` - never both.

    The one convention of the library's verbs: ``verb(subject, config: XConfig | None = None, **options)``, where
    ``options`` are ``XConfig``'s own field names; the fields are declared once, on the frozen dataclass ``cls``,
    and the keywords are checked against them here. An unknown keyword raises ``PttError`` naming it, the closest
    field and the fields there are; a keyword beside a ``config`` raises ``PttError`` naming it; a field without a
    default that no keyword gives is missing. The price of declaring the fields once: a type checker sees
    ``**options: Any``, so a misspelt keyword is caught here, at run time, and a wrong type only where the verb
    or the config checks it; ``verb(x, XConfig(...))`` has the type checker check every field. ``options_of``
    shows the fields in the verb's signature (``help()``, an editor's completion).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class RunConfig:
        ...     rounds: int = 5
        ...     device: str = "cpu"
        >>> config_first(None, RunConfig, {"rounds": 3})
        RunConfig(rounds=3, device='cpu')
        >>> config_first(RunConfig(7), RunConfig, {})
        RunConfig(rounds=7, device='cpu')
        >>> config_first(None, RunConfig, {"round": 3})
        Traceback (most recent call last):
        ...
        pytorchtricks.core.PttError: unknown option 'round': did you mean 'rounds'? the options are RunConfig's fields (rounds, device).
        >>> config_first(RunConfig(7), RunConfig, {"device": "cuda"})
        Traceback (most recent call last):
        ...
        pytorchtricks.core.PttError: pass a RunConfig or keywords, not both (got device too).
    """
    import difflib

    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]  # a dataclass by contract
    names = [f.name for f in fields]
    unknown = [k for k in options if k not in names]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        guess = f" did you mean {close[0]!r}?" if close else ""
        raise PttError(
            f"unknown option {unknown[0]!r}:{guess} the options are {cls.__name__}'s fields ({', '.join(names)})."
        )
    if config is not None:
        if not isinstance(config, cls):
            raise PttError(f"config must be a {cls.__name__}, not {type(config).__name__}.")
        if options:
            an = "an" if cls.__name__[0] in "AEIOU" else "a"
            raise PttError(
                f"pass {an} {cls.__name__} or keywords, not both (got {', '.join(sorted(options))} too)."
            )
        return config
    missing = [f.name for f in fields if _required(f) and f.name not in options]
    if missing:
        raise PttError(f"missing {', '.join(missing)}: pass them as keywords, or pass a {cls.__name__}.")
    return cls(**options)


F = TypeVar("F", bound=Callable[..., Any])


def options_of(cls: type) -> Callable[[F], F]:
    """Show a verb's options, ``cls``'s fields, in its signature in place of its ``**options``: what ``help()``,
    ``inspect.signature`` and an editor's completion read, generated from the config (never written twice). The
    verb itself is unchanged; ``config_first`` checks the keywords it gets.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class RunConfig:
        ...     rounds: int = 5
        >>> @options_of(RunConfig)
        ... def run(fn, config=None, **options): return config_first(config, RunConfig, options)
        >>> import inspect; str(inspect.signature(run)), run(print, rounds=2)
        ("(fn, config=None, *, rounds: 'int' = 5)", RunConfig(rounds=2))
    """
    import inspect

    def mark(fn: F) -> F:
        sig = inspect.signature(fn)
        named = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in named}
        fields = [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=_shown_default(f), annotation=f.type
            )
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # a dataclass by contract
            if f.init and f.name not in taken
        ]
        fn.__signature__ = sig.replace(parameters=[*named, *fields])  # type: ignore[attr-defined]
        return fn

    return mark


def _shown_default(f: dataclasses.Field[Any]) -> Any:
    import inspect

    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
