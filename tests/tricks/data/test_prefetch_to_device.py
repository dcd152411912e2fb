"""prefetch_to_device: the CPU thread path yields exactly the batches of plain iteration; CUDA path (gpu)."""

from __future__ import annotations

import pytest
import torch

from pytorchtricks.core import PttError
from pytorchtricks.tricks.data.make_loader import _photo_bytes, make_loader
from pytorchtricks.tricks.data.prefetch_to_device import prefetch_to_device

MEAN, STD = [123.7, 116.3, 103.5], [58.4, 57.1, 57.4]


def _loader():
    data = [(raw, i) for i, (raw, _) in enumerate(_photo_bytes(20, (48, 64)))]
    return make_loader(data, 6, crop=24, num_workers=0, drop_last=False, seed=5)


def _reference(loader, dtype=torch.float32):
    m = torch.tensor(MEAN).view(1, 3, 1, 1)
    s = torch.tensor(STD).view(1, 3, 1, 1)
    return [(((x.float() - m) / s).to(dtype), y) for x, y in loader]


def test_cpu_prefetch_yields_the_same_batches_as_no_prefetch():
    loader = _loader()
    loader.set_epoch(0)
    ref = _reference(loader)
    loader.set_epoch(0)
    got = list(prefetch_to_device(loader, "cpu", normalize=(MEAN, STD), channels_last=True))
    assert len(got) == len(ref) == 4
    for (x, y), (rx, ry) in zip(got, ref):
        assert x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x, rx)
        assert torch.equal(y, ry)
    raw = list(prefetch_to_device(_loader(), "cpu"))  # no normalize: uint8 passes through untouched
    for (x, _), (rx, _) in zip(raw, list(_loader())):
        assert x.dtype == torch.uint8 and torch.equal(x, rx)


def test_dtype_cast_and_set_epoch_pass_through():
    loader = _loader()
    pre = prefetch_to_device(loader, "cpu", normalize=(MEAN, STD), dtype=torch.bfloat16)
    pre.set_epoch(0)
    x, _ = next(iter(pre))
    loader.set_epoch(0)
    torch.testing.assert_close(x, _reference(loader, torch.bfloat16)[0][0])
    assert len(pre) == len(loader)


def test_errors_in_the_loader_reach_the_consumer_and_early_exit_does_not_hang():
    def bad():
        yield torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1)
        raise ValueError("broken sample 7")

    it = iter(prefetch_to_device(bad(), "cpu"))
    next(it)
    with pytest.raises(ValueError, match="broken sample 7"):
        next(it)
    many = ((torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1)) for _ in range(100))
    for _ in prefetch_to_device(many, "cpu", depth=1):
        break


def test_misuse_raises_with_the_fix():
    with pytest.raises(PttError, match="std"):
        prefetch_to_device([], "cpu", normalize=([0.0] * 3, [1.0, 0.0, 1.0]))
    with pytest.raises(PttError, match="depth"):
        prefetch_to_device([], "cpu", depth=0)
    with pytest.raises(PttError, match="tuple of tensors"):
        list(prefetch_to_device(["not a batch"], "cpu"))


@pytest.mark.gpu
def test_cuda_prefetch_matches_cpu_path():
    loader = _loader()
    loader.set_epoch(0)
    ref = list(prefetch_to_device(loader, "cpu", normalize=(MEAN, STD), channels_last=True))
    loader.set_epoch(0)
    got = list(prefetch_to_device(loader, "cuda", normalize=(MEAN, STD), channels_last=True))
    for (x, y), (rx, ry) in zip(got, ref):
        assert x.is_cuda and y.is_cuda
        torch.testing.assert_close(x.cpu(), rx)
        assert torch.equal(y.cpu(), ry)
