"""dataset_on_device: every sample once per epoch, seeded shuffles, and the memory check refuses what won't fit."""

from __future__ import annotations

import pytest
import torch

from pytorchtricks.core import PttError
from pytorchtricks.tricks.data import dataset_on_device as mod


def _data(n=23):
    x = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 4, 4).contiguous()
    return x, torch.arange(n)


def test_every_sample_once_per_epoch_and_pixels_follow_labels():
    x, y = _data()
    dd = mod.dataset_on_device(x, y, 5, device="cpu")
    for _ in range(2):
        seen = []
        for xb, yb in dd:
            assert torch.equal(xb[:, 0, 0, 0].long(), yb)
            seen += yb.tolist()
        assert sorted(seen) == list(range(23))
    assert len(dd) == 5 and len(mod.dataset_on_device(x, y, 5, device="cpu", drop_last=True)) == 4


def test_seeded_shuffle_and_augment():
    x, y = _data()
    a = [b[1].tolist() for b in mod.dataset_on_device(x, y, 4, device="cpu", seed=1, augment={"flip": True})]
    b = [b[1].tolist() for b in mod.dataset_on_device(x, y, 4, device="cpu", seed=1, augment={"flip": True})]
    c = [b[1].tolist() for b in mod.dataset_on_device(x, y, 4, device="cpu", seed=2)]
    assert a == b and a != c


def test_memory_check_refuses_what_would_not_fit(monkeypatch):
    monkeypatch.setattr(mod, "_free_bytes", lambda dev: 1000)
    mod._check_fits(700, torch.device("cpu"), 0.25)
    with pytest.raises(PttError, match="cache_in_ram"):
        mod._check_fits(800, torch.device("cpu"), 0.25)  # 800 > 75% of 1000


@pytest.mark.gpu
def test_cuda_resident_set_and_refusal(monkeypatch):
    x, y = _data()
    dd = mod.dataset_on_device(x, y, 5, device="cuda", augment={"flip": True, "translate": 1})
    assert sorted(int(v) for _, yb in dd for v in yb) == list(range(23))
    monkeypatch.setattr(mod, "_free_bytes", lambda dev: 10)
    with pytest.raises(PttError, match="free"):
        mod.dataset_on_device(x, y, 5, device="cuda")


def test_misuse():
    x, y = _data()
    with pytest.raises(PttError, match="uint8"):
        mod.dataset_on_device(x.float(), y, 4, device="cpu")
    with pytest.raises(PttError, match="labels"):
        mod.dataset_on_device(x, y[:3], 4, device="cpu")


def test_a_config_gives_the_same_batches_as_its_keywords():
    x, y = _data()
    opts = {"device": "cpu", "seed": 4, "drop_last": True, "augment": {"flip": True}}
    by_kw = [b[1].tolist() for b in mod.dataset_on_device(x, y, 4, **opts)]
    by_cfg = [b[1].tolist() for b in mod.dataset_on_device(x, y, 4, mod.DeviceDatasetConfig(**opts))]
    assert by_kw == by_cfg and len(by_kw) == 5
    with pytest.raises(PttError, match="unknown option 'drop_lats': did you mean 'drop_last'"):
        mod.dataset_on_device(x, y, 4, drop_lats=True)
