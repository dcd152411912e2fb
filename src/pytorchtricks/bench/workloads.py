"""Models and inputs that commands and benchmarks share: model specs and shapes (the small reference models are
``pytorchtricks.fixtures``, on the bottom floor, where the tricks' bench cases reach them)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import sys
from collections.abc import Callable
from typing import Any

from torch import nn

from pytorchtricks.core import PttError, require


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse ``"1,3,224,224"`` (or ``1x3x224x224``) into a tuple of positive ints.

    Example:
        >>> parse_shape("1,3,32,32")
        (1, 3, 32, 32)
    """
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError as exc:
        raise PttError(
            f"bad shape {text!r}; write it as comma-separated integers, e.g. 1,3,224,224."
        ) from exc
    if not shape or any(d <= 0 for d in shape):
        raise PttError(f"bad shape {text!r}; every dimension must be a positive integer, e.g. 1,3,224,224.")
    return shape


def load_model(spec: str, **kwargs: Any) -> nn.Module:
    """Build a model from a spec: ``torchvision:NAME``, ``package.module:factory`` or ``path/to/file.py:factory``.

    torchvision models get random weights (nothing is downloaded). Errors say what failed and how to fix it.
    ``package.module:factory`` imports the module and ``path/to/file.py:factory`` runs the file's top-level code,
    then the factory is called: both execute code, as ``python -c "import ..."`` would - give only specs you trust.
    Built-in functions and classes that are not ``nn.Module`` are refused before any call; a factory that exits
    the process (``SystemExit``) or returns something else than an ``nn.Module`` is an error.

    Example:
        >>> type(load_model("torch.nn:Identity")).__name__
        'Identity'
    """
    if ":" not in spec:
        raise PttError(
            f"bad model spec {spec!r}; use torchvision:NAME, package.module:factory or path/to/file.py:factory."
        )
    where, name = spec.rsplit(":", 1)
    factory: Callable[..., Any]
    if where == "torchvision":
        tvm = require("torchvision.models", "data", package="torchvision")
        try:
            factory = tvm.get_model_builder(name)
        except ValueError as exc:
            raise PttError(
                f"torchvision has no model {name!r}; see torchvision.models.list_models() for names."
            ) from exc
        kwargs.setdefault("weights", None)  # never download weights at run time
        if "weights_backbone" in inspect.signature(factory).parameters:  # detectors: nor their backbone's
            kwargs.setdefault("weights_backbone", None)
    else:
        module = _import_module_or_file(where)
        factory = getattr(module, name, None)  # type: ignore[assignment]
        if factory is None or not callable(factory):
            raise PttError(f"{where} has no callable {name!r}; check the name after the colon in {spec!r}.")
        if inspect.isbuiltin(factory) or (
            isinstance(factory, type) and not issubclass(factory, nn.Module)
        ):  # os:abort, sys:exit, builtins:print ... are not model factories: refused before they are called
            raise PttError(
                f"{spec} is {'a built-in function' if inspect.isbuiltin(factory) else 'a class that is not an nn.Module'}"
                ", not a model factory; --model must name a function or nn.Module class that returns the model."
            )
    said = io.StringIO()  # what the factory prints to stderr: shown after it returns, dropped if it exits
    try:
        with contextlib.redirect_stderr(said):
            model = factory(**kwargs)
    except SystemExit as exc:  # e.g. a script's main() parsing our command line with its own argparse
        script = where if where.endswith(".py") else "train.py"
        raise PttError(
            f"calling {spec} tried to exit the process (SystemExit {exc.code!r}); name a factory that builds and "
            "returns the model instead of a script's entry point. To tune a training script as it is, run it "
            f"under the doctor: ptt doctor run --tune -- python {script} ARGS"
        ) from exc
    except Exception as exc:
        sys.stderr.write(said.getvalue())
        raise PttError(
            f"calling {spec} failed: {type(exc).__name__}: {exc}. Fix the factory or its arguments."
        ) from exc
    sys.stderr.write(said.getvalue())
    if not isinstance(model, nn.Module):
        raise PttError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module.")
    return model


def _import_module_or_file(where: str) -> Any:
    if where.endswith(".py") or os.sep in where:
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise PttError(f"no such file {where!r}; give an existing .py file before the colon.")
        mod_name = "_ptt_user_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise PttError(f"cannot import {where!r} as a Python file.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(mod_name, None)
            raise PttError(f"importing {where} failed: {type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(where)
    except Exception as exc:
        raise PttError(
            f"cannot import module {where!r} ({type(exc).__name__}: {exc}); is it installed or on PYTHONPATH?"
        ) from exc
