"""``ptt.watch``: the per-step split of ``ptt doctor run``, recorded inside the user's own loop.

For users who would rather not run their script under the doctor: wrap the loop (or the function that runs it),
nothing else changes::

    with ptt.watch(model, loader, optimizer) as w:
        for x, y in loader:
            ...
            optimizer.step()
    print(w.summary())            # the split, the loader's settings, host syncs, the verdict and its first fix
    w.save("doctor-out")          # results.jsonl + report.html, as `ptt doctor run --out` writes them
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from pytorchtricks.analysis.step_split import Recorder, RunReport, collect, instrument

__all__ = ["Watch", "watch"]


class Watch(contextlib.ContextDecorator):
    """What ``watch`` returns: a ``with`` block or a decorator; ``report`` (a ``RunReport``) is filled when the
    block ends."""

    def __init__(self, model: Any, loader: Any, optimizer: Any, warmup: int) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}.")
        self._objects = (model, loader, optimizer)
        self.warmup = warmup
        self.report: RunReport | None = None
        self._stack: list[tuple[Recorder, contextlib.ExitStack]] = []

    def __enter__(self) -> Watch:
        caller = sys._getframe(1)
        if caller.f_code.co_name == "inner" and caller.f_back is not None:  # used as a decorator
            caller = caller.f_back
        model, loader, optimizer = self._objects
        rec = Recorder(
            {caller.f_code.co_filename}, self.warmup, model=model, optimizer=optimizer, loader=loader
        )
        stack = contextlib.ExitStack()
        stack.enter_context(instrument(rec))
        rec.restart()
        self._stack.append((rec, stack))
        return self

    def __exit__(self, *exc: object) -> None:
        rec, stack = self._stack.pop()
        stack.close()
        ended = f"the block ended after {rec.steps_text()}"
        self.report = collect(rec, RunReport(argv=["ptt.watch"], warmup=self.warmup, ended=ended))

    def summary(self) -> str:
        """The split per stage, the loader's settings, the host syncs and the verdict, as text."""
        r = self._done()
        m = r.mean_s()
        lines = [f"{r.ended}: {len(r.steps)} measured, verdict {r.verdict}", r.evidence]
        lines += [
            f"loader: {x['via']} over {x['dataset']}, batch {x['batch_size']}, {x['num_workers']} workers, "
            f"pin_memory {x['pin_memory']}"
            for x in r.loaders
        ]
        lines += [f"host sync: {where} {n:.1f} per step" for where, n in r.syncs[:5]]
        lines.append(f"first fix: {r.fix}")
        return "\n".join(lines) if m["step"] or r.steps else "\n".join(lines[:1] + lines[-1:])

    def save(self, out_dir: str) -> str:
        """``out_dir/results.jsonl`` and ``out_dir/report.html``; returns the folder."""
        from pytorchtricks.analysis.script_run import write_run

        write_run(self._done(), out_dir)
        return out_dir

    def _done(self) -> RunReport:
        if self.report is None:
            raise RuntimeError("ptt.watch has no report yet: read it after the `with` block ends.")
        return self.report


def watch(model: Any = None, loader: Any = None, optimizer: Any = None, *, warmup: int = 1) -> Watch:
    """Record the per-step split (data wait, forward, backward, optimizer, other) of the loop inside the block.

    A step ends at each ``optimizer.step()``; the first ``warmup`` steps are not measured. ``model`` /
    ``loader`` / ``optimizer``, when given, are the only ones timed (an EMA model or a validation loader in the
    same block is left out); left at None, every one the block uses is. Works as a ``with`` and as a decorator.
    The hooks add time, never change what the loop computes.

    Example:
        >>> model, opt = torch.nn.Linear(4, 2), None
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=4)
        >>> with ptt.watch(model, loader, opt, warmup=0) as w:
        ...     for (x,) in loader:
        ...         model(x).sum().backward()
        ...         opt.step()
        >>> len(w.report.steps), w.report.loaders[0]["batch_size"], w.report.verdict in ("input-bound", "compute-bound", "optimizer-bound")
        (3, 4, True)
    """
    return Watch(model, loader, optimizer, warmup)
