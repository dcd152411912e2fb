"""``/dev/shm`` against a DataLoader's batches in flight, predicted before its workers start (``ptt doctor run``).

A worker hands every tensor of a batch over as a file of ``/dev/shm``; the loader keeps ``num_workers x
prefetch_factor`` batches queued and the loop holds one or two more. When that is more than ``/dev/shm`` has
free (a container's 64 MB), the first batches fail with torch's "unable to allocate shared memory" or a bus
error. ptt's own loaders plan around it (``data.shm``); for any other DataLoader the doctor reads one sample in
this process (every random stream given back afterwards) and states the need.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from pytorchtricks.data.shm import HELD_BATCHES, RESERVE_BYTES, SHM_DIR, ShmPlan, shm_fixes, shm_space

PAGE = 4096  # each tensor is a shared-memory file of its own: whole pages
# what fixes a DataLoader that ran out of /dev/shm, besides more room (data.shm.shm_fixes says how much)
SHM_OTHER = (
    "Or lower num_workers, prefetch_factor or the batch, or read through ptt.make_loader, which fits itself to "
    "/dev/shm."
)
SHM_FIX = (
    "Give /dev/shm room (`docker run --shm-size=...`; Kubernetes: an emptyDir with `medium: Memory` at /dev/shm). "
    + SHM_OTHER
)


def dataloader_shm(loader: Any) -> dict[str, Any] | None:
    """``{"need_bytes", "free_bytes", "total_bytes", "fits", "text"}`` for ``loader`` (a DataLoader) with
    workers; None without workers, without ``/dev/shm``, or where one sample cannot be read up front (an
    iterable dataset). ptt's loaders report their own plan."""
    if getattr(loader, "num_workers", 0) < 1:
        return None
    space = shm_space()
    if space is None:
        return None
    plan: ShmPlan | None = getattr(getattr(loader.dataset, "slots", None), "plan", None)
    if plan is not None:  # ptt.make_loader / make_detection_loader: planned to fit when made
        return {"need_bytes": plan.need_bytes, "free_bytes": space.free_bytes, "total_bytes": space.total_bytes,
                "fits": True, "text": plan.describe()}  # fmt: skip
    if isinstance(loader.dataset, torch.utils.data.IterableDataset) or hasattr(loader.dataset, "slots"):
        return None
    batch = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    sample = _one_sample(loader)
    if sample is None:
        return None
    batch_bytes = batch * _shared_bytes(sample)
    in_flight = loader.num_workers * (loader.prefetch_factor or 2) + HELD_BATCHES
    need = in_flight * batch_bytes
    fits = need + RESERVE_BYTES <= space.free_bytes
    text = (
        f"{SHM_DIR} {space.total_bytes / 2**20:.0f} MiB ({space.free_bytes / 2**20:.0f} MiB free); batches in "
        f"flight ~{need / 2**20:.0f} MiB ({in_flight} of ~{batch_bytes / 2**20:.1f} MiB: {loader.num_workers} "
        f"workers x prefetch_factor {loader.prefetch_factor} + {HELD_BATCHES} held)"
    )
    if not fits:
        text += (
            f": its workers will fail ('unable to allocate shared memory' or 'Bus error'). {shm_fixes(need, space)} "
            f"{SHM_OTHER}"
        )
    return {"need_bytes": need, "free_bytes": space.free_bytes, "total_bytes": space.total_bytes, "fits": fits,
            "text": text}  # fmt: skip


def is_shm_failure(exc: BaseException) -> bool:
    """True when ``exc`` is torch's error for a worker that ran out of ``/dev/shm``."""
    text = str(
        exc
    ).lower()  # no space for a file ("unable to allocate shared memory(shm)"), or a page it could
    # not back, which kills the worker ("killed by signal: Bus error")
    return isinstance(exc, RuntimeError | OSError) and ("shared memory" in text or "bus error" in text)


def _one_sample(loader: Any) -> Any:
    """The loader's first sample, read here with torch's, numpy's and Python's random streams given back (the
    script's own draws stay what they were), or None when it cannot be read."""
    py, npy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
            first = next(iter(sampler))
            index = first[0] if isinstance(first, list | tuple) else first
            return loader.dataset[index]
    except Exception:  # the doctor only looks: a dataset that cannot be read here is left to the run itself
        return None
    finally:
        random.setstate(py)
        np.random.set_state(npy)


def _shared_bytes(sample: Any) -> int:
    """Bytes of ``sample``'s tensors and arrays as shared-memory files (whole pages each); PIL images and other
    objects are pickled through the queue instead."""
    if isinstance(sample, torch.Tensor | np.ndarray):
        n = sample.nbytes
        return -(-n // PAGE) * PAGE
    if isinstance(sample, dict):
        return sum(_shared_bytes(v) for v in sample.values())
    if isinstance(sample, list | tuple):
        return sum(_shared_bytes(v) for v in sample)
    return 0
