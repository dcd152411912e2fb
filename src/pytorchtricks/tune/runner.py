"""One configuration of the workload with a set of tricks applied, as a callable training (or inference) step.

``Runner(workload, tricks)`` builds a fresh model copy (same initial weights every time) and a ``TuneSetup``
holding the user's configuration (their optimizer and hyper-parameters, their input pipeline), then lets each
trick's ``TUNE`` hook edit it, in the hooks' order - the runner never names a trick. ``step()`` - next batch, host
to device, forward, loss, backward, optimizer - is what the measuring engine times; ``step(sw)`` does the same with
every stage timed by a ``Stopwatch`` (the step-time split of the diagnosis).

Data comes through one road: the user's pipeline (``data.baselines``: torchvision ImageFolder + PIL) or the
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

from pytorchtricks.clock import Stopwatch, hold_s, now_s
from pytorchtricks.core import PttWarning, cache_root
from pytorchtricks.data.baselines import detection_reference_loader, imagefolder_loader
from pytorchtricks.data.normalization import IMAGENET_MEAN_PX, IMAGENET_STD_PX
from pytorchtricks.tricks.runtime.seed_everything import seed_worker
from pytorchtricks.tunable import TuneSetup
from pytorchtricks.tune.hooks import by_name, with_requirements
from pytorchtricks.tune.workload import Workload, to_channels

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
        split=w.split,
        cache_dir=cache_root(),
        dataset=w.dataset,
        loader_kwargs={"num_workers": w.num_workers},
        activation_budget_bytes=w.run.activation_budget_bytes,
        memo=w.run.memo,
        task=w.task,
        max_size=w.max_size,
    )


def prepare_key(name: str, earlier: tuple[str, ...]) -> str:
    """The name ``name``'s one-time state is kept under: its own, or ``"<name> on <loader tricks>"`` when loader
    tricks other than its requirements come before it (a loader sweep over a RAM cache is another sweep)."""
    extra = [
        t for t in earlier if by_name(t).hook.changes == "loader" and t not in by_name(name).hook.requires
    ]
    return f"{name} on {'+'.join(extra)}" if extra else name


def prepared(w: Workload, name: str, setup: TuneSetup | None = None, earlier: tuple[str, ...] = ()) -> Any:
    """The one-time state of ``name``'s hook (a pack, a RAM cache, a loader sweep): built once per run (``w.run``)
    and key (``prepare_key``), its seconds recorded in ``w.run.prepare_s`` (the receipt's one-time cost and
    break-even epochs). ``setup``: the configuration as the hooks ``earlier`` left it (default: the user's)."""
    hook = by_name(name).hook
    if hook.prepare is None:
        return None
    key, run = prepare_key(name, earlier), w.run
    if key not in run.prepared:
        s = dataclasses.replace(setup if setup is not None else base_setup(w), notes=[])
        beside = _StepBeside(w)
        s.step_beside = beside
        t0 = now_s()
        try:
            with warnings.catch_warnings(record=True) as caught:  # said once, in the receipt's notes
                warnings.simplefilter("always")
                run.prepared[key] = hook.prepare(s)
        finally:
            beside.close()
        said = [str(c.message) for c in caught if issubclass(c.category, PttWarning)] + s.notes
        run.notes.extend(f"{key}: {msg}" for msg in dict.fromkeys(said))
        state = run.prepared[key]
        run.prepare_s[key] = (
            float(state["build_s"]) if isinstance(state, dict) and "build_s" in state else now_s() - t0
        )
    return run.prepared[key]


def prepare_all(w: Workload, tricks: tuple[str, ...]) -> None:
    """Build the one-time state of ``tricks`` and their requirements, in order, as a Runner would use it
    (raises ``TuneSkip`` from a hook that cannot build, e.g. a cache that does not fit)."""
    s = base_setup(w)
    done: tuple[str, ...] = ()
    for name in with_requirements(tricks):
        hook = by_name(name).hook
        state = prepared(w, name, s, done)
        if hook.changes == "loader":  # what a later loader hook's prepare reads (the dataset, the loader)
            hook.apply(s, state)
        done = (*done, name)


class _StepBeside:
    """``step_beside`` for a hook's ``prepare``: the user's untreated step on a fresh model copy, built on its
    first call (a prepare that never times its loader builds nothing)."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.runner: Runner | None = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        if self.runner is None:
            self.runner = Runner(self.w, (), loader=False)
        return self.runner.on_batch(x, y)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None


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
        self.dtype = torch.float32  # to_float64() for exactness checks
        self.tricks = with_requirements(tuple(tricks))
        self.train = w.for_ == "train"
        self.seed = seed
        torch.manual_seed(seed)
        model = w.model_factory()
        if not self.train:
            model.eval()
        model.to(w.device)
        setup = base_setup(w, model)
        if w.task == "classification":  # a planner's batch: the first n samples as the step takes them
            setup.batch_of = lambda n: self._batch_of(n, setup)
        for i, name in enumerate(self.tricks):  # in the hooks' order (with_requirements sorts by it)
            hook = by_name(name).hook
            if setup.example is None and hook.changes in ("model", "step") and w.task == "classification":
                setup.example = self.prepare(w.example_batch(min(w.batch_size, 8))[0])
            elif setup.example is None and hook.changes == "model" and w.task == "detection" and batches:
                from pytorchtricks.tune import detection

                # the detector's own (images, targets) of a real batch
                setup.example = detection.to_model_inputs(*batches[0], w.device, self.dtype)
            hook.apply(setup, prepared(w, name, setup, self.tricks[:i]))
        self.setup = setup
        self.model = setup.model
        self.channels_last = setup.channels_last
        self.forward: Any = setup.forward if setup.forward is not None else setup.model
        self.mp = setup.precision
        self.switches = list(setup.switches)
        self.optimizer: Any = None
        self.acc: Any = (
            None  # the accumulator of K micro-batches (a step hook's), or None: one batch, one step
        )
        self.micro_batches = max(1, int(setup.micro_batches))
        if self.train:
            make = setup.make_optimizer or _optimizer(*setup.optimizer)
            self.optimizer = make(self.model.parameters())
            if setup.accumulate is not None and self.micro_batches > 1:
                with warnings.catch_warnings(record=True) as caught:  # said once, in the receipt's notes
                    warnings.simplefilter("always")
                    self.acc = setup.accumulate(self.model, self.optimizer, self.mp)
                w.run.notes.extend(
                    n
                    for n in (str(c.message) for c in caught if issubclass(c.category, UserWarning))
                    if n not in w.run.notes
                )
        self.num_workers = int(setup.loader_kwargs.get("num_workers", 0))
        self._staged = batches  # batches held in memory: the step without its loader (the compute step)
        self._loader = self._build_loader() if loader and batches is None else None
        self._it: Iterator[Any] | None = None

    # -- data

    def _build_loader(self) -> Any:
        s, w = self.setup, self.w
        size = (w.input_size, w.width or w.input_size)
        if w.task == "detection":  # the reference's pipeline, or ours (the decode at the training size)
            from pytorchtricks.tune import detection

            if s.loader == "ptt":
                return detection.our_loader(
                    s.dataset, w.batch_size, w.input_size, w.max_size or 1333, s.loader_kwargs, self.seed,
                    self.train,
                )  # fmt: skip
            return detection_reference_loader(  # workers persist: deactivate() stops them between variants
                s.dataset, w.batch_size, self.num_workers, self.seed, self.train
            )
        if s.loader == "device":  # a dataset resident on the device (dataset_on_device) is its own loader
            loader: Any = s.dataset
        elif s.loader == "ptt":
            from pytorchtricks.tricks.data.make_loader import make_loader

            kw = dict(s.loader_kwargs)
            # workers across epochs; deactivate() stops them between variants
            kw.setdefault("persistent_workers", True)
            loader = make_loader(
                s.dataset,
                w.batch_size,
                crop=size,
                mode="train" if self.train else "eval",
                seed=self.seed,
                **kw,
            )
        elif w.data_kind == "files":
            loader = imagefolder_loader(
                w.source or "", w.batch_size, size, num_workers=self.num_workers, train=self.train,
                seed=self.seed, channels=w.channels, persistent=True, worker_init_fn=seed_worker,
            )  # fmt: skip
        else:  # a pack or synthetic data, as the user reads it today: a plain DataLoader over the dataset
            g = torch.Generator().manual_seed(self.seed)
            loader = torch.utils.data.DataLoader(
                w.dataset, batch_size=w.batch_size, shuffle=self.train, drop_last=self.train,
                num_workers=self.num_workers, generator=g, persistent_workers=self.num_workers > 0,
            )  # fmt: skip
        for wrap in s.device_loader:
            loader = wrap(loader)
        return loader

    def next_batch(self) -> tuple[Any, Any]:
        if self._staged is not None:
            if self._it is None:
                self._it = itertools.cycle(self._staged)
            return next(self._it)  # type: ignore[no-any-return]
        if self._loader is None:
            raise RuntimeError("this Runner was built without a loader")
        if self._it is None:
            self._it = iter(self._loader)
        try:
            batch = next(self._it)
        except StopIteration:  # the next epoch
            self._it = iter(self._loader)
            batch = next(self._it)
        if self.w.task == "detection" and len(batch) != 2:
            return batch, None  # a DetectionBatch (images, sizes, targets): on_batch reads it whole
        return batch  # type: ignore[no-any-return]

    def activate(self) -> None:
        """Start this variant's loader workers and run one untimed step per worker before a timed block.

        The workers start together, so their first batches arrive together; once those are taken every worker
        is busy on its next batch and the queue is empty, as in the middle of an epoch (taking one batch only
        would leave the other workers' first batches ready, and a short timed block would get them free). Running
        the step on them, not just reading them, also pays the first step after a switch from another variant
        (its weights and buffers cold: measured 1.5-2.7x a steady step), which is not the user's steady state.
        """
        if self._staged is None and self._loader is not None and self._it is None:
            for _ in range(max(1, self.num_workers)):
                self.step()

    def deactivate(self) -> None:
        """Stop this variant's loader workers while another variant is timed: idle workers refilling their
        queues would take the cores from the variant being measured.

        The loaders keep their workers across epochs (``persistent_workers``): tune times the steady state of an
        epoch. A worker start at every epoch boundary (measured 0.45 s for 2 workers on 2 cores) is a per-epoch
        cost; over tune's few hundred images it lands in a timed block or not by chance - one in 8 steps on
        the demo, the step's time doubled on average - and would make the ratios noise, where over the user's
        millions of images it is nothing. So the workers are stopped here, and the next ``activate`` starts
        fresh ones."""
        if self._staged is not None:
            return
        if self._it is not None:
            _stop_workers_now(self._it)
            self._it = None
        for dl in _dataloaders(self._loader):
            if dl._iterator is not None:  # a persistent loader's iterator, workers and all
                _stop_workers_now(dl._iterator)
                dl._iterator = None

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of either road -> normalised float on the device, in the model's channels and memory format."""
        if x.dtype == torch.uint8:
            x = to_channels(x, self.w.channels)
        x = normalize(x, self.w.device, channels_last=getattr(self, "channels_last", False))
        return x if self.dtype == torch.float32 else x.to(self.dtype)

    def _batch_of(self, n: int, setup: TuneSetup) -> torch.Tensor:
        """``TuneSetup.batch_of``: the workload's first ``n`` samples, normalised on the device in the memory
        format the hooks so far chose (the step's own input, for a hook that plans on it)."""
        x = self.prepare(self.w.example_batch(n)[0])
        return x.contiguous(memory_format=torch.channels_last) if setup.channels_last else x

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
        out = self.on_batch(xb, yb, sw)
        # Releasing the batch is the loader's cost too, and is timed as such: the reference pipeline's 12 MP
        # float32 images are ~150 MB each of shared memory to unmap (10-30 ms per batch of 4 measured here),
        # time that fell outside every stage of the split before.
        with stage("data wait"):
            del xb, yb
        return out

    def on_batch(self, xb: torch.Tensor, yb: torch.Tensor, sw: Stopwatch | None = None) -> Any:
        """The step on a batch already read (what ``step`` runs after ``next_batch``)."""

        def stage(name: str) -> Any:
            return sw.stage(name, synchronize=True) if sw is not None else contextlib.nullcontext()

        if self.w.device_step_s is not None:  # a declared accelerator step: held, not computed here
            with stage("device step (declared)"):
                hold_s(self.w.device_step_s)
            return None
        if self.w.task == "detection":
            return self._detection_step(xb, yb, stage)
        with stage("host->device"):
            x, y = self.prepare(xb), yb.to(self.w.device, non_blocking=True)
        if not self.train:
            with stage("forward"), torch.inference_mode(), self.autocast():
                return self.forward(x)
        if self.acc is not None:  # K micro-batches, each weighted by its samples; the K-th backward steps
            with stage("backward"), self.acc:
                for xm, ym in zip(x.tensor_split(self.micro_batches), y.tensor_split(self.micro_batches)):
                    _, loss = self.loss_of(xm, ym)
                    self.acc.backward(loss, weight=len(xm))
            return loss
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

    def _detection_step(self, xb: Any, yb: Any, stage: Any) -> Any:
        """The detector's training step: its loss dict summed (``tune.detection``)."""
        from pytorchtricks.tune import detection

        with stage("host->device"):
            images, targets = detection.to_model_inputs(xb, yb, self.w.device, self.dtype)
        if (
            self.acc is not None
        ):  # K micro-batches of images (as tensor_split cuts a batch), each weighted by its
            with stage("backward"), self.acc:  # images; the K-th backward steps the optimizer
                for idx in torch.arange(len(images)).tensor_split(self.micro_batches):
                    ims, tgs = [images[i] for i in idx], [targets[i] for i in idx]
                    with self.autocast():
                        _, loss = detection.loss_of(self.forward, ims, tgs)
                    self.acc.backward(loss, weight=len(ims))
            return loss
        with stage("forward"), self.autocast():
            _, loss = detection.loss_of(self.forward, images, targets)
        with stage("backward"):
            self.optimizer.zero_grad(set_to_none=True)
            self.mp.backward(loss) if self.mp is not None else loss.backward()
        with stage("optimizer"):
            self.mp.step(self.optimizer) if self.mp is not None else self.optimizer.step()
        return loss

    def loss_on(self, xb: Any, yb: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs, loss) of a batch as a loader gives it, either task: a detector's outputs are its losses."""
        if self.w.task == "detection":
            from pytorchtricks.tune import detection

            with self.autocast():
                out, loss = detection.loss_of(
                    self.forward, *detection.to_model_inputs(xb, yb, self.w.device, self.dtype)
                )
            return out.float(), loss.float()
        return self.loss_of(self.prepare(xb), yb.to(self.w.device))

    def to_float64(self) -> None:
        """Compute in float64 from here on (model, inputs, optimizer state): an exactness check free of fp32's
        rounding. Parameters are converted in place, so the optimizer keeps them."""
        self.model.double()
        self.dtype = torch.float64

    def update_on(self, xb: torch.Tensor, yb: torch.Tensor) -> dict[str, torch.Tensor]:
        """One training step on the batch ``(xb, yb)``; returns each parameter's update (after - before): what
        an exact memory trick must leave equal (accumulation's K micro-batches vs the batch at once)."""
        before = {k: p.detach().clone() for k, p in self.model.named_parameters()}
        self.on_batch(xb, yb)
        return {k: p.detach() - before[k] for k, p in self.model.named_parameters()}

    def resident_bytes(self) -> int:
        """Bytes that stay allocated between steps: parameters, buffers, gradients still held and the optimizer
        state (each storage once). A step's peak is this plus what the step allocates on top."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.optimizer is not None:
            tensors += [t for st in self.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
        seen = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors}
        return sum(n for _, n in seen)

    def close(self) -> None:
        """Stop loader workers and drop the model (frees worker processes and memory)."""
        self.deactivate()
        self._it = None
        self._loader = None
        self.forward = self.model = self.optimizer = self.acc = None


def normalize(x: torch.Tensor, device: torch.device, *, channels_last: bool = False) -> torch.Tensor:
    """A batch from either road -> normalised float32 on ``device``: uint8 (library loaders) is normalised there,
    float (the torchvision baseline, ``data.baselines``) is already normalised on the host and only moved."""
    from pytorchtricks.tricks.data.device_augment import batch_normalize

    x = x.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        gray = x.shape[1] == 1
        x = batch_normalize(x, (127.5,) if gray else IMAGENET_MEAN_PX, (127.5,) if gray else IMAGENET_STD_PX)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _dataloaders(loader: Any, depth: int = 4) -> list[torch.utils.data.DataLoader[Any]]:
    """The torch DataLoaders inside ``loader``: itself, or held by the wrappers around it (``ptt.make_loader``'s
    ``Loader``, a device prefetcher), a few attributes deep."""
    if isinstance(loader, torch.utils.data.DataLoader):
        return [loader]
    if loader is None or depth == 0 or isinstance(loader, torch.Tensor | str | bytes | int | float):
        return []
    found: list[torch.utils.data.DataLoader[Any]] = []
    for value in getattr(loader, "__dict__", {}).values():
        if isinstance(value, torch.utils.data.DataLoader) or hasattr(value, "__dict__"):
            found.extend(d for d in _dataloaders(value, depth - 1) if all(d is not f for f in found))
    return found


def _stop_workers_now(it: Any) -> None:
    """Terminate a DataLoader iterator's workers instead of letting its shutdown wait for each to finish the
    batch in hand (a second of decoding that the next variant's block would wait on or pay for).

    In the order that cannot hang: the workers' done event is set while they are all alive (setting it takes a
    lock that a worker holds for an instant whenever it checks the event: a worker killed at that instant keeps
    it forever), the pin-memory thread is stopped, the pids are unregistered from torch's SIGCHLD check (or the
    terminated workers would read as crashed), the workers are terminated and reaped, the index queues closed,
    and the iterator is marked shut down so that neither its ``__del__`` nor torch's exit handler for persistent
    workers sets the event again - that second ``Event.set()`` after a kill is the hang torch's own shutdown
    warns of (it hung the suite once). Uses the iterator's private fields; without them (another torch) the
    iterator's own shutdown runs, only slower."""
    workers = getattr(it, "_workers", None)
    if not workers or not getattr(it, "_worker_pids_set", False) or getattr(it, "_shutdown", True):
        return
    from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL, signal_handling

    try:
        it._shutdown = True
        if hasattr(it, "_pin_memory_thread"):
            it._pin_memory_thread_done_event.set()
            it._worker_result_queue.put((None, None))
            it._pin_memory_thread.join()
        it._workers_done_event.set()
        signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False
    except (RuntimeError, AttributeError):  # no worker was killed: the iterator's own shutdown stays safe
        it._shutdown = False
        return
    for proc in workers:
        if proc.is_alive():
            proc.terminate()
    for proc in workers:
        proc.join(timeout=MP_STATUS_CHECK_INTERVAL)
    for q in getattr(it, "_index_queues", []):
        q.cancel_join_thread()
        q.close()


def stage_batches(w: Workload, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of the user's pipeline, read and held in memory: ``Runner(w, t, batches=...)``
    then times only the compute step (host->device, forward, backward, optimizer), without the loader.
    Read once per run (``w.run``: decoding full-size photos in-process takes seconds) and shared by every phase."""
    have: list[tuple[torch.Tensor, torch.Tensor]] = w.run.staged
    if len(have) < n:
        r = Runner(w, ())  # the user's loader, workers and all: the same batches, read sooner
        try:
            for i in range(n):  # the first n batches of a fresh loader: the same ones whoever asks first
                batch = r.next_batch()
                if i >= len(have):
                    have.append(batch)
        finally:
            r.close()
    return have[:n]
