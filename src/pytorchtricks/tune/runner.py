"""One configuration of the workload with a set of tricks applied, as a callable training (or inference) step.

``Runner(workload, tricks)`` builds a fresh model copy (same initial weights every time), applies the tricks in a
fixed order (model rewrites, optimizer, precision, compile, loader), and exposes ``step()`` - next batch, host to
device, forward, loss, backward, optimizer - which is what the measuring engine times. ``step(sw)`` does the same
with every stage timed by a ``Stopwatch`` (the step-time split of the diagnosis).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pytorchtricks.bench.measure import Stopwatch
from pytorchtricks.core import PttError
from pytorchtricks.tune.workload import Workload

# ImageNet statistics: inputs are normalised on the fly from uint8, as a real loop would.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def norm_stats(channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of shape (1, C, 1, 1) in uint8 units: ImageNet's for RGB, their channel average otherwise."""
    if channels == 3:
        return MEAN, STD
    return MEAN.mean().expand(1, channels, 1, 1), STD.mean().expand(1, channels, 1, 1)


LR, MOMENTUM = 0.01, 0.9
LOADER_WORKERS = 2
PREFETCH_FACTOR = 2


def ptt_function(name: str) -> Any | None:
    """``getattr(ptt, name)`` if this build exports and can import it, else ``None``."""
    import pytorchtricks as ptt

    if name not in ptt._EXPORTS:
        return None
    try:
        return getattr(ptt, name)
    except (ImportError, AttributeError):
        return None


def loader_workers() -> int:
    import os

    return max(1, min(LOADER_WORKERS, (os.cpu_count() or 1)))


def make_loader(
    w: Workload, num_workers: int, seed: int = 0, *, pin_memory: bool = False
) -> torch.utils.data.DataLoader[Any]:
    """A plain torch DataLoader over the workload's dataset: seeded shuffling, fixed batch shape (drop_last)."""
    from pytorchtricks.tricks.runtime.seed_everything import seed_worker

    g = torch.Generator().manual_seed(seed)
    n = max(len(w.dataset), w.batch_size)  # type: ignore[arg-type]
    sampler = torch.utils.data.RandomSampler(w.dataset, num_samples=n, generator=g)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=PREFETCH_FACTOR, worker_init_fn=seed_worker)
    return torch.utils.data.DataLoader(
        w.dataset,
        batch_size=w.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory and w.device.type == "cuda",  # only host->CUDA copies gain from pinned pages
        **kwargs,
    )


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
        self.tricks = tuple(tricks)
        self.train = w.for_ == "train"
        dev = w.device
        torch.manual_seed(seed)
        self._mean, self._std = (t.to(dev) for t in norm_stats(w.channels))
        self.channels_last = "to_channels_last" in tricks
        model = w.model_factory()
        on = set(self.tricks)
        if "remove_conv_bias_before_bn" in on:
            _need("remove_conv_bias_before_bn_")(model)
        if not self.train:
            model.eval()
        if "fuse_conv_bn" in on:
            _need("fuse_conv_bn_")(model)
        model.to(dev)
        if self.channels_last:
            _need("to_channels_last_")(model)
        self.model = model
        self.forward: Any = model
        self.optimizer: Any = None
        if self.train:
            if "fast_optimizer" in on:
                self.optimizer = _need("fast_optimizer")(model.parameters(), "sgd", lr=LR, momentum=MOMENTUM)
            else:
                self.optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        self.mp = _need("mixed_precision")(dev, dtype="bf16") if "mixed_precision" in on else None
        if "quantize" in on:
            x, _ = w.example_batch(min(w.batch_size, 8))
            # FX int8 without torch.compile: PT2E's int8 kernels need minutes of compilation on a CPU
            self.forward = _need("quantize_")(model, self.prepare(x), compile=False, backend="fx")
        if "compile" in on:
            self.forward = _need("compile_")(model, for_inference=not self.train)
        # process-wide switches are entered around every step, so interleaved variants do not leak into each other
        self.switches = [_need(n) for n in ("enable_cudnn_benchmark", "enable_tf32") if n in on]
        # the baseline loads as the user's loop does (w.num_workers); the trick raises it to loader_workers()
        self.num_workers = max(w.num_workers, loader_workers()) if "loader_workers" in on else w.num_workers
        pin = "pin_memory" in on
        self._staged = batches  # batches held in memory: the step without its loader (the compute step)
        self._loader = (
            make_loader(w, self.num_workers, seed, pin_memory=pin) if loader and batches is None else None
        )
        self._it: Iterator[Any] | None = None

    # -- data

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
        except StopIteration:  # non-persistent loaders: start the next epoch
            self._it = iter(self._loader)
            return next(self._it)  # type: ignore[no-any-return]

    def drain(self) -> None:
        """Consume the batches workers prepared while other variants were being timed (untimed).

        Worker processes keep filling their queue while the engine times other configurations; without this the
        next timed block would start with free batches and overstate the loader's gain. After draining, the timed
        block starts with an empty queue - if anything, understating it.
        """
        if self.num_workers > 0 and self._staged is None:
            for _ in range(self.num_workers * PREFETCH_FACTOR):
                self.next_batch()

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW on the host -> normalised float on the device (the host->device stage)."""
        x = x.to(self.w.device, non_blocking=True).float().sub_(self._mean).div_(self._std)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

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
        self.forward = self.model = self.optimizer = None  # type: ignore[assignment]


def stage_batches(w: Workload, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``n`` batches of the in-process loader, held in memory: ``Runner(w, t, batches=...)`` then times
    only the compute step (host->device, forward, backward, optimizer), without the loader's time and noise."""
    return list(itertools.islice(iter(make_loader(w, 0)), n))


def _need(name: str) -> Any:
    fn = ptt_function(name)
    if fn is None:
        raise PttError(f"ptt.{name} is not available in this build; tune cannot apply it.")
    return fn


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items() if v.is_floating_point()}
