"""How a trick tells ``ptt tune`` to apply it: ``TUNE = TuneHook(...)`` beside ``TRICK`` in the trick's module.

The catalogue is the only registry: tune enumerates the trick modules, keeps those with a ``TUNE`` hook, asks each
hook whether it applies (``applies(facts)`` returns the reason it does not, or None), builds each configuration
by letting the hooks edit a ``TuneSetup`` in their ``order``, checks it the way the hook says (``check``) and
times it. Nothing under ``tune/`` names a trick.

Bottom floor: this module imports nothing from pytorchtricks but ``core`` (torch only for types), so every trick
module may import it.

Example:
    >>> hook = TuneHook(changes="model", check="exact", receipt="ptt.fuse_conv_bn_(model)", apply=lambda s, _: None)
    >>> hook.applies(TuneFacts(phase="train")) is None, hook.cost
    (True, 'free')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["TuneFacts", "TuneHook", "TuneSetup", "TuneSkip", "applied_or_skip", "unless_input_bound"]

Changes = Literal["model", "optimizer", "loader", "precision", "step", "switch"]
CheckKind = Literal["exact", "approximate", "data"]
Cost = Literal["free", "cache", "repack", "compile"]
CHANGES: tuple[str, ...] = ("model", "optimizer", "loader", "precision", "step", "switch")
CHECKS: tuple[str, ...] = ("exact", "approximate", "data")
COSTS: tuple[str, ...] = ("free", "cache", "repack", "compile")


class TuneSkip(Exception):
    """Raised by a hook's ``prepare``/``apply`` when its trick cannot run here; the message (with the numbers)
    becomes the candidate's skip reason in the receipt (e.g. a RAM cache that does not fit)."""


@dataclass
class TuneFacts:
    """What tune knows when it asks a hook whether its trick applies (the workload and its diagnosis).

    Attributes:
        phase: ``"train"`` or ``"infer"``.
        device: ``"cpu"`` or ``"cuda"``.
        verdict: the diagnosis: ``"input-bound"``, ``"compute-bound"`` (or ``""`` before it is known).
        data_wait_share: the share of the step the input pipeline costs (0..1): waiting for data, or on a CPU
            the cores its workers take from the step, whichever is larger.
        data_kind: ``"files"`` (an image folder), ``"pack"`` (a ``ptt pack`` folder), ``"synthetic"`` or
            ``"dataset"`` (a user's dataset object).
        data_bytes: bytes of the data tune sees (None when unknown).
        num_samples: samples in the data tune sees.
        input_size: the side of the model's input in pixels.
        free_ram_bytes: available RAM (None when unknown).
        cpu_count: CPU cores this process may use.
        budget_left_s: seconds left of tune's time budget.
        conv_bias_pairs: convolutions with a bias that feed a BatchNorm.
        conv_bn_pairs: Conv -> BatchNorm pairs that can be folded.
        has_conv2d: the model has 2-D convolutions.
        native_bf16: the device computes bf16 natively (``hardware.cpu_caps().native_bf16`` on CPU).
        baseline: the user's settings as tune found them (``num_workers``, ``pin_memory``, ``optimizer``...).
        batch_size: the effective batch of one optimizer step (what accumulation splits into micro-batches).
        goal: ``"speed"``, ``"memory"`` or ``"both"``; memory tricks are tried when memory is a goal or a
            ``memory_budget_bytes`` is set.
        memory_budget_bytes: the step peak the configuration must fit (``--memory-budget``), or None.
    """

    phase: str = "train"
    device: str = "cpu"
    verdict: str = ""
    data_wait_share: float = 0.0
    data_kind: str = "files"
    data_bytes: int | None = None
    num_samples: int = 0
    input_size: int = 0
    free_ram_bytes: int | None = None
    cpu_count: int = 1
    budget_left_s: float = float("inf")
    conv_bias_pairs: int = 0
    conv_bn_pairs: int = 0
    has_conv2d: bool = False
    native_bf16: bool = False
    baseline: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 0
    goal: str = "speed"
    memory_budget_bytes: int | None = None

    # whether a loader that spends fewer CPU-seconds per sample may speed the step up: the diagnosis's verdict
    # (``analysis.verdict.LOADER_CAN_HELP``: input-bound or CPU-contended) or figures too uncertain to rule it out;
    # None: not given (a verdict of "input-bound" alone then says yes)
    loader_can_help: bool | None = None
    # the accelerator's step, declared (``ptt tune --device-step-ms``): only loaders are measured against it
    declared_step_s: float | None = None
    task: str = "classification"  # or "detection": only hooks whose ``tasks`` name it are measured

    @property
    def input_bound(self) -> bool:
        if self.loader_can_help is not None:
            return self.loader_can_help
        return self.verdict == "input-bound"

    @property
    def memory_search(self) -> bool:
        """Whether tune searches for memory (a budget to fit, or memory as a goal)."""
        return self.memory_budget_bytes is not None or self.goal != "speed"


@dataclass
class TuneSetup:
    """One configuration under construction: hooks edit it in their ``order``; tune builds the step from it.

    Model side: ``model`` (on the device), ``optimizer`` (the user's ``(name, hyper-parameters)``, e.g.
    ``("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4})``), ``make_optimizer(params)`` (None: the
    plain torch optimizer of that name; a hook may swap the implementation, never the hyper-parameters),
    ``forward`` (a compiled or quantized
    callable; None: the model), ``precision`` (an object with ``autocast()``, ``backward(loss)`` and
    ``step(opt)``, e.g. ``ptt.mixed_precision``; None: fp32), ``channels_last`` (inputs in that memory format),
    ``switches`` (context-manager factories entered around every step).
    Data side: ``source`` (the data folder or pack tune was given; None for synthetic data; ``split``: the split of
    a detection root that tune read, None when it has one), ``cache_dir`` (where
    one-time builds go), ``dataset`` (what the library's loaders read; a hook may replace it, e.g. by its RAM cache),
    ``loader`` (``"baseline"``: the user's pipeline, or ``"ptt"``: ``ptt.make_loader``), ``loader_kwargs``
    (keyword arguments for ``make_loader``: workers, prefetch, pin), ``device_loader`` (callables wrapping the
    built loader, e.g. ``prefetch_to_device``). ``step_beside(images, labels)`` runs the user's untreated
    training step on one loader batch, for a ``prepare`` that times its loader with the step beside it (the
    workers compete with the training threads for the cores, as in the user's job); None outside ``prepare``.
    A hook's ``prepare`` sees the dataset as the loader hooks before it (in ``order``) left it: a sweep after a
    RAM cache sweeps over the cache.
    ``example`` is a float input batch on the device for hooks that need one; ``notes`` collect what a hook did.
    Step side (memory): ``micro_batches`` (K: the batch is split into K micro-batches, one optimizer step per
    batch) with ``accumulate(model, optimizer, precision)`` building the object whose ``backward(loss, weight=)``
    accumulates them (e.g. ``ptt.accumulate_gradients``); ``activation_budget_bytes``: what the activations of one
    micro-batch may take in a memory search (the budget less what the step holds beside them: params, buffers,
    grads, optimizer state and the step's input batch; None: no budget),
    for a hook that plans to a budget (a checkpoint planner). ``task``: the workload's (``"classification"`` or
    ``"detection"``: the model is a torchvision detector taking lists of images and targets).
    ``batch_of(n)``: the workload's first ``n`` samples as the step takes them (a float batch on the device), for a
    hook that plans on the workload's own batch (a checkpoint planner: on one micro-batch); None where tune has
    none to give (a detector: ``example`` is its images and targets). ``memo``: one dict for the whole run, shared
    by every configuration's setup, where a hook keeps what it worked out once under its own key (a checkpoint
    plan for this model, micro-batch and budget, put again on each fresh model copy instead of measured again).
    """

    model: Any
    optimizer: tuple[str, dict[str, Any]]
    device: Any
    train: bool
    example: Any
    batch_size: int
    input_size: int
    make_optimizer: Callable[[Any], Any] | None = None
    source: str | None = None
    split: str | None = None
    cache_dir: str = ""
    dataset: Any = None
    loader: str = "baseline"
    loader_kwargs: dict[str, Any] = field(default_factory=dict)
    device_loader: list[Callable[[Any], Any]] = field(default_factory=list)
    forward: Any = None
    precision: Any = None
    channels_last: bool = False
    switches: list[Callable[[], Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    step_beside: Callable[[Any, Any], Any] | None = None
    micro_batches: int = 1
    accumulate: Callable[[Any, Any, Any], Any] | None = None
    activation_budget_bytes: int | None = None
    task: str = "classification"
    max_size: int | None = None  # detection: the long side's cap of the detector's resize (its transform's)
    batch_of: Callable[[int], Any] | None = None
    memo: dict[Any, Any] = field(default_factory=dict)

    @property
    def micro_batch_size(self) -> int:
        """Samples in one micro-batch (the batch when there is no accumulation)."""
        return -(-self.batch_size // max(1, self.micro_batches))


@dataclass(frozen=True)
class TuneHook:
    """How ``ptt tune`` applies a trick; declared as ``TUNE = TuneHook(...)`` in the trick's module.

    Attributes:
        changes: what the trick changes: ``model``, ``optimizer``, ``loader``, ``precision``, ``step`` or
            ``switch`` (a process-wide switch entered around the step). Loader tricks are timed on the whole step,
            the others on the compute step with batches staged in memory.
        check: how tune proves the configuration right: ``exact`` (outputs, gradients and the update equal the
            untreated step's), ``approximate`` (loss parity and SQNR within ``bound``) or ``data`` (every sample
            once per epoch, the same labels, batches of the expected dtype/shape, pixels within ``bound`` PSNR).
        receipt: the line ``apply.py`` writes (``{batch_size}``, ``{input_size}``, ``{workers}`` are filled in).
        apply: ``apply(setup, state)`` edits a ``TuneSetup``; ``state`` is what ``prepare`` returned (None).
        applies: ``applies(facts)`` -> the reason the trick cannot help on this workload, or None.
        prepare: optional one-time work shared by every configuration that uses the trick (a pack, a RAM cache,
            a loader sweep): ``prepare(setup) -> state`` on a baseline setup; tune times it and reports the cost.
            ``prepare`` or ``apply`` raise ``TuneSkip`` (with the numbers) when the trick cannot run here.
        cost: ``free``, ``cache`` (a one-time build in RAM), ``repack`` (a one-time rewrite of the data) or
            ``compile`` (minutes of compilation).
        order: where the hook runs when several apply (lower first): the micro-batch split 5 (model rewrites
            then plan for the micro-batch), model rewrites 10-40, optimizer 50, precision 60, step wrappers 70-80,
            data 100+ (what replaces the dataset before what builds the loader).
        fixes: the diagnosis finding it removes (kept when not measurably slower), e.g. ``"PTL001"``.
        requires: tricks that must be in the same configuration (``cache_in_ram`` needs ``make_loader``).
        bound: the named error bound of an approximate or data check, said in the receipt.
        group: tricks of one group replace the same thing (``"dataset"``: a RAM cache, a pack): a configuration
            holds at most one of them.
        variant: a second way to apply the same trick (e.g. ``pack`` with ``--resize``): a module may declare
            ``TUNE = (TuneHook(...), TuneHook(..., variant="resize"))``; the candidate is then ``pack[resize]``.
        last: the trick tunes what the others built (a loader sweep timed over the chosen dataset): the
            combination adds it after every other winner, and its ``prepare`` runs again over that combination.
        loop: a step hook's training loop for ``apply.py`` (replaces the plain loop there; ``{receipt}`` is its
            receipt line, plus the receipt's fields); ``detection_loop``: the same on a detection workload.
        tasks: the workloads the hook builds and checks (``"classification"``, ``"detection"``); tune skips it
            on others, saying so. ``detection_receipt``: its receipt line on a detection workload (default:
            ``receipt``); it may name ``{max_size}``, the long side's cap.
    """

    changes: Changes
    check: CheckKind
    receipt: str
    apply: Callable[[TuneSetup, Any], None]
    applies: Callable[[TuneFacts], str | None] = lambda facts: None
    prepare: Callable[[Any], Any] | None = None
    cost: Cost = "free"
    order: int = 50
    fixes: str | None = None
    requires: tuple[str, ...] = ()
    bound: str = ""
    group: str = ""
    variant: str = ""
    last: bool = False
    loop: str = ""
    tasks: tuple[str, ...] = ("classification",)
    detection_receipt: str = ""
    detection_loop: str = ""

    def __post_init__(self) -> None:
        if self.changes not in CHANGES:
            raise ValueError(f"TuneHook.changes must be one of {CHANGES}, got {self.changes!r}")
        if self.check not in CHECKS:
            raise ValueError(f"TuneHook.check must be one of {CHECKS}, got {self.check!r}")
        if self.cost not in COSTS:
            raise ValueError(f"TuneHook.cost must be one of {COSTS}, got {self.cost!r}")

    @property
    def scope(self) -> str:
        """``"step"`` (timed with the loader) for loader tricks, else ``"compute"`` (batches staged)."""
        return "step" if self.changes == "loader" else "compute"


def applied_or_skip(rewrite: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a trick's rewrite for a hook's ``apply``; a rewrite that changes nothing on this model (its
    ``NoEffectWarning``) or refuses it (``PttError``) becomes ``TuneSkip`` with its message, the candidate's reason."""
    import warnings

    from pytorchtricks.core import NoEffectWarning, PttError

    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        try:
            return rewrite(*args, **kwargs)
        except (NoEffectWarning, PttError) as exc:
            raise TuneSkip(str(exc)) from exc


def stored_side(input_size: int) -> int:
    """The short side a data trick keeps its images at (a RAM cache, a resized pack, a device-resident set) so that
    RandomResizedCrop's smallest crop (8% of the area) still covers the input size.

    Example:
        >>> stored_side(32)
        113
    """
    return max(input_size, round(input_size / 0.08**0.5))


def unless_input_bound(facts: TuneFacts, kinds: tuple[str, ...] = ("files", "pack")) -> str | None:
    """The ``applies`` of a loader trick: why it cannot help unless the data is of ``kinds`` and the step waits
    on its input (None: it can)."""
    if facts.data_kind not in kinds:
        return f"reads {' or '.join(kinds)} (image files, ptt packs); this data is {facts.data_kind}"
    if not facts.input_bound:
        return (
            f"the step does not wait on input (the input pipeline costs {facts.data_wait_share:.0%} of it, verdict "
            f"{facts.verdict or 'unknown'}): a faster loader cannot speed it up"
        )
    return None
