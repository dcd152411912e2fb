"""One configuration of the workload with a set of tricks applied, as a callable training (or inference) step.

``Runner(workload, tricks)`` builds a fresh model copy (same initial weights every time) and a ``TuneSetup``
holding the user's configuration (their optimizer and hyper-parameters, their input pipeline), then lets each
trick's ``TUNE`` hook edit it, in the hooks' order - the runner never names a trick. ``step()`` - next batch, host
to device, forward, loss, backward, optimizer - is what the measuring engine times; ``step(sw)`` does the same with
every stage timed by a ``Stopwatch`` (the step-time split of the diagnosis).

Data comes through one road: the user's pipeline (``tune.baseline``: torchvision ImageFolder + PIL) or the
library's (``ptt.make_loader`` over the setup's dataset, which a hook may have replaced by a RAM cache or a pack).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from pytorchtricks.bench.measure import Stopwatch, now_s
from pytorchtricks.core import PttWarning
from pytorchtricks.tunable import TuneSetup
from pytorchtricks.tune.baseline import normalize, user_loader
from pytorchtricks.tune.hooks import by_name, with_requirements
from pytorchtricks.tune.workload import Workload, cache_root, to_channels

PREFETCH_FACTOR = 2


def _optimizer(name: str, kwargs: dict[str, Any]) -> Any:
    cls = {
        c.lower(): getattr(torch.optim, c)
        for c in dir(torch.optim)
        if isinstance(getattr(torch.optim, c), type)
    }
    return lambda params: cls[name.lower()](params, **kwargs)


def base_setup(w: Workload, model: Any = None) -> TuneSetup:
    """The user's configuration, before any trick: what hooks edit and ``prepare`` reads."""
    return TuneSetup(
        model=model,
        optimizer=w.optimizer,
        device=w.device,
        train=w.for_ == "train",
        example=None,
        batch_size=w.batch_size,
        input_size=w.input_size,
        source=w.source,
        cache_dir=cache_root(),
        dataset=w.dataset,
        loader_kwargs={"num_workers": w.num_workers},
    )


def prepared(w: Workload, name: str) -> Any:
    """The one-time state of ``name``'s hook (a pack, a RAM cache, a loader sweep): built once per workload, its
    seconds recorded in ``w.prepare_s`` (the receipt's one-time cost and break-even epochs)."""
    hook = by_name(name).hook
    if hook.prepare is None:
        return None
    if name not in w.prepared:
        t0 = now_s()
        with warnings.catch_warnings(record=True) as caught:  # said once, in the receipt's notes
            warnings.simplefilter("always")
            w.prepared[name] = hook.prepare(base_setup(w))
        for msg in dict.fromkeys(str(c.message) for c in caught if issubclass(c.category, PttWarning)):
            w.notes.append(f"{name}: {msg}")
        state = w.prepared[name]
        w.prepare_s[name] = (
            float(state["build_s"]) if isinstance(state, dict) and "build_s" in state else now_s() - t0
        )
    return w.prepared[name]


class Runner:
    """The workload with ``tricks`` applied; ``step()`` runs one timed unit of work (one batch)."""

    def __init__(
        self,
        w: Workload,
        tricks: tuple[str, ...] = (),
        *,
        seed: int = 0,
        loader: bool = True,
        batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self.w = w
        self.tricks = with_requirements(tuple(tricks))
        self.train = w.for_ == "train"
        self.seed = seed
        torch.manual_seed(seed)
        model = w.model_factory()
        if not self.train:
            model.eval()
        model.to(w.device)
        setup = base_setup(w, model)
        for name in self.tricks:  # in the hooks' order (with_requirements sorts by it)
            hook = by_name(name).hook
            if setup.example is None and hook.changes in ("model", "step"):
                setup.example = self.prepare(w.example_batch(min(w.batch_size, 8))[0])
            hook.apply(setup, prepared(w, name))
        self.setup = setup
        self.model = setup.model
        self.channels_last = setup.channels_last
        self.forward: Any = setup.forward if setup.forward is not None else setup.model
        self.mp = setup.precision
        self.switches = list(setup.switches)
        self.optimizer: Any = None
        if self.train:
            make = setup.make_optimizer or _optimizer(*setup.optimizer)
            self.optimizer = make(self.model.parameters())
        self.num_workers = int(setup.loader_kwargs.get("num_workers", 0))
        self._staged = batches  # batches held in memory: the step without its loader (the compute step)
        self._loader = self._build_loader() if loader and batches is None else None
        self._it: Iterator[Any] | None = None

    # -- data

    def _build_loader(self) -> Any:
        s, w = self.setup, self.w
        size = (w.input_size, w.width or w.input_size)
        if s.loader == "ptt":
            from pytorchtricks.tricks.data.make_loader import make_loader

            kw = dict(s.loader_kwargs)
            kw.setdefault("persistent_workers", False)  # workers live only while their variant is timed
            loader: Any = make_loader(
                s.dataset,
                w.batch_size,
                crop=size,
                mode="train" if self.train else "eval",
                seed=self.seed,
                **kw,
            )
        elif w.data_kind == "files":
            loader = user_loader(
                w.source or "", w.batch_size, size, num_workers=self.num_workers, train=self.train,
                seed=self.seed, channels=w.channels, persistent=False,
            )  # fmt: skip
        else:  # a pack or synthetic data, as the user reads it today: a plain DataLoader over the dataset
            g = torch.Generator().manual_seed(self.seed)
            loader = torch.utils.data.DataLoader(
                w.dataset, batch_size=w.batch_size, shuffle=self.train, drop_last=self.train,
                num_workers=self.num_workers, generator=g,
            )  # fmt: skip
        for wrap in s.device_loader:
            loader = wrap(loader)
        return loader

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._staged is not None:
            if self._it is None:
                self._it = itertools.cycle(self._staged)
            return next(self._it)  # type: ignore[no-any-return]
        if self._loader is None:
            raise RuntimeError("this Runner was built without a loader")
        if self._it is None:
            self._it = iter(self._loader)
        try:
            return next(self._it)  # type: ignore[no-any-return]
        except StopIteration:  # the next epoch
            self._it = iter(self._loader)
            return next(self._it)  # type: ignore[no-any-return]

    def activate(self) -> None:
        """Start this variant's loader workers and take their first batch (untimed) before a timed block: the
        block then starts with the workers running and the queue near empty, as in the middle of an epoch."""
        if self._staged is None and self._loader is not None and self._it is None:
            self.next_batch()

    def deactivate(self) -> None:
        """Stop this variant's loader workers while another variant is timed: idle workers refilling their
        queues would take the cores from the variant being measured."""
        if self._staged is None:
            self._it = None

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of either road -> normalised float on the device, in the model's channels and memory format."""
        if x.dtype == torch.uint8:
            x = to_channels(x, self.w.channels)
        return normalize(x, self.w.device, channels_last=getattr(self, "channels_last", False))

    def autocast(self) -> Any:
        return self.mp.autocast() if self.mp is not None else contextlib.nullcontext()

    # -- the step

    def loss_of(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            out = self.forward(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out, F.cross_entropy(out.float(), y % out.shape[1])

    def step(self, sw: Stopwatch | None = None) -> Any:
        if not self.switches:
            return self._step(sw)
        with contextlib.ExitStack() as stack:
            for switch in self.switches:
                stack.enter_context(switch())
            return self._step(sw)

    def _step(self, sw: Stopwatch | None = None) -> Any:
        def stage(name: str) -> Any:
            return sw.stage(name, synchronize=True) if sw is not None else contextlib.nullcontext()

        with stage("data wait"):
            xb, yb = self.next_batch()
        with stage("host->device"):
            x, y = self.prepare(xb), yb.to(self.w.device, non_blocking=True)
        if not self.train:
            with stage("forward"), torch.inference_mode(), self.autocast():
                return self.forward(x)
        with stage("forward"):
            _, loss = self.loss_of(x, y)
        with stage("backward"):
            self.optimizer.zero_grad(set_to_none=True)
            if self.mp is not None:
                self.mp.backward(loss)
            else:
                loss.backward()
        with stage("optimizer"):
            if self.mp is not None:
                self.mp.step(self.optimizer)
            else:
                self.optimizer.step()
        return loss

    def close(self) -> None:
        """Stop loader workers and drop the model (frees worker processes and memory)."""
        self._it = None
        self._loader = None
        self.forward = self.model = self.optimizer = None


def stage_batches(w: Workload, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of the user's pipeline, read in-process and held in memory: ``Runner(w, t, batches=...)``
    then times only the compute step (host->device, forward, backward, optimizer), without the loader."""
    r = Runner(dataclasses.replace(w, num_workers=0), ())
    try:
        return [r.next_batch() for _ in range(n)]
    finally:
        r.close()
