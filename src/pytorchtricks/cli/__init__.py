"""The ``pytorchtricks`` / ``ptt`` command line. Thin: parse, call the library, print.

One module per command group (``catalogue``, ``doctor``, ``tune``, ``data``, ``analysis``, ``optimize``); every
subcommand is an ``_add_<name>(subparsers)`` that registers its arguments and sets ``handler``. Errors from bad
input (``PttError``) print one line with the fix and exit with status 2; a ``PttWarning`` prints one line too. A
message that names an option (a ``core.Spelt``) is printed as the command line spells it: ``--split val2017``, not
the library's ``split='val2017'``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pytorchtricks.cli._common import EXIT_USAGE, MODEL_SPEC_HELP
from pytorchtricks.cli.analysis import _add_flops, _add_lint, _add_memory, _add_profile
from pytorchtricks.cli.catalogue import _add_bench, _add_list, _add_report, _add_show
from pytorchtricks.cli.data import _add_inspect, _add_pack
from pytorchtricks.cli.doctor import _add_doctor
from pytorchtricks.cli.optimize import _add_optimize
from pytorchtricks.cli.tune import _add_tune
from pytorchtricks.cli.yolo import _add_yolo
from pytorchtricks.core import PttError, PttWarning, for_cli

__all__ = ["EXIT_USAGE", "MODEL_SPEC_HELP", "build_parser", "main"]

# subcommands that run models (and time them with torch.utils.benchmark, which imports torch.utils.cpp_extension)
_TORCH_COMMANDS = ("bench", "doctor", "tune", "lint", "profile", "flops", "memory", "optimize")

_COMMANDS: list[Callable[[Any], None]] = [
    _add_list,
    _add_show,
    _add_bench,
    _add_report,
    _add_doctor,
    _add_tune,
    _add_pack,
    _add_inspect,
    _add_lint,
    _add_profile,
    _add_flops,
    _add_memory,
    _add_optimize,
    _add_yolo,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptt",
        description="pytorchtricks: PyTorch speed and memory tricks, tested and measured on your hardware.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def _script_given_to_tune(argv: Sequence[str]) -> str | None:
    """``ptt tune train.py``: the .py file given where tune takes options (a user with a training script)."""
    if list(argv[:1]) != ["tune"]:
        return None
    for i, tok in enumerate(argv[1:], start=1):
        if tok.endswith(".py") and not argv[i - 1].startswith("-"):
            return tok
    return None


@contextlib.contextmanager
def _spelt_for_the_command_line() -> Iterator[None]:
    """While a command runs, a ``PttWarning`` is printed as one line, ``warning: ...``, its options (a ``Spelt``)
    in the command line's spelling; every other warning as Python shows it."""
    shown = warnings.showwarning

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if isinstance(message, PttWarning):
            print(f"warning: {for_cli(message)}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    script = _script_given_to_tune(argv)
    if script is not None:
        print(
            f"error: ptt tune takes a model and data (--model, --data), not a script. To tune {script} as it is "
            f"(its own model, optimizer and data), run it under the doctor: ptt doctor run --tune -- python {script} "
            "ARGS",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        # `kill -USR1 <pid>` prints every thread's stack to stderr: where a long pack or tune is, or what it waits on
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
        except (
            OSError,
            ValueError,
            AttributeError,
        ):  # stderr is not a file (captured, embedded): no stack dumps
            pass
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    if args.command in _TORCH_COMMANDS:  # `ptt list` and friends stay light: no torch import for them
        from pytorchtricks.quiet import import_cpp_extension_quietly

        import_cpp_extension_quietly()  # its "No CUDA runtime is found, using CUDA_HOME" is noise on a CPU run
    try:
        with _spelt_for_the_command_line():
            return int(args.handler(args) or 0)
    except PttError as exc:
        print(f"error: {for_cli(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
