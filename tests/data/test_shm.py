"""Loaders and /dev/shm: the plan (fits, fewer batches in flight, memory files, the error), the memory-file
slots (the same batches as /dev/shm's, freed and reused, through fork and spawn), the doctors' prediction, and
the real thing: real photos through make_loader and make_detection_loader in a 64 MB /dev/shm of their own."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import pytorchtricks as ptt
import pytorchtricks.data.shm as shm
from pytorchtricks.analysis.loader_shm import dataloader_shm, is_shm_failure
from pytorchtricks.core import PttWarning
from pytorchtricks.data.batches import BatchSlots, _MemFile
from pytorchtricks.data.shm import ShmError, ShmSpace, plan_shm
from pytorchtricks.tricks.data.make_loader import _photo_bytes

MIB = 2**20
SMALL = ShmSpace("/dev/shm", 64 * MIB, 64 * MIB)  # Docker's default


def test_the_plan_keeps_what_fits_then_lowers_the_prefetch_then_uses_memory_files():
    assert plan_shm("x", MIB, 2, 2, space=SMALL) == shm.ShmPlan(2, "shm", 8 * MIB, SMALL)
    p = plan_shm("x", 8 * MIB, 2, 4, space=SMALL)  # 2 x (4+2) x 8 = 96 MiB; 2 x (1+2) x 8 = 48 MiB fits
    assert (p.prefetch_factor, p.backing, p.need_bytes) == (1, "shm", 48 * MIB)
    assert "1 batch per worker in flight instead of 4" in p.message and "--shm-size" in p.message
    p = plan_shm("make_loader", 38 * MIB, 2, 2, space=SMALL, memfd=True)
    assert (p.prefetch_factor, p.backing) == (2, "memfd")
    assert "anonymous memory files" in p.message and "medium: Memory" in p.message


def test_nothing_fits_is_a_ptt_error_with_the_size_the_need_and_the_fixes():
    with pytest.raises(ShmError) as err:
        plan_shm("make_detection_loader", 38 * MIB, 2, 2, space=SMALL, memfd=False)
    text = str(err.value)
    for want in (
        "/dev/shm (64 MiB, 64 MiB free)",
        "304 MiB",
        "--shm-size=1g",
        "medium: Memory",
        "num_workers",
    ):
        assert want in text, want
    assert isinstance(err.value, ptt.PttError)
    from pytorchtricks.core import for_cli

    assert "num_workers=0" in text and "--workers 0" in for_cli(err.value)  # each reader its own spelling


def test_without_dev_shm_there_is_nothing_to_plan(monkeypatch):
    monkeypatch.setattr(
        shm, "shm_space", lambda path=shm.SHM_DIR: None
    )  # not Linux: torch shares its own way
    p = plan_shm("x", 10**12, 8, 2)
    assert (p.backing, p.prefetch_factor, p.message) == ("shm", 2, None)


@pytest.fixture()
def tiny_shm(monkeypatch):
    """A /dev/shm that holds nothing: every loader plans memory files."""
    monkeypatch.setattr(
        shm, "shm_space", lambda path=shm.SHM_DIR: ShmSpace(path, 8 * MIB, 8 * MIB)
    )  # all of it the reserve


def _batches(loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]


@pytest.mark.skipif(not shm.memfd_available(), reason="no memfd_create on this system")
def test_memory_file_slots_give_the_same_batches_as_dev_shm(tiny_shm, monkeypatch):
    data = _photo_bytes(24, (60, 80))
    with pytest.warns(PttWarning, match="anonymous memory files"):
        viafile = ptt.make_loader(data, 4, crop=32, num_workers=2, seed=5)
    assert viafile.shm.backing == "memfd" and viafile.dataloader.dataset.slots.file is not None
    monkeypatch.undo()
    plain = ptt.make_loader(data, 4, crop=32, num_workers=2, seed=5)
    alone = ptt.make_loader(data, 4, crop=32, num_workers=0, seed=5)
    assert plain.shm.backing == "shm"
    for epoch in range(2):  # the second epoch writes into slots the first one freed
        got, want, ref = _batches(viafile), _batches(plain), _batches(alone)
        assert len(got) == len(want) == 6, epoch
        for (a, ya), (b, _), (c, yc) in zip(got, want, ref, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(ya, yc)


@pytest.mark.skipif(not shm.memfd_available(), reason="no memfd_create on this system")
def test_a_memory_file_slot_is_reused_only_once_the_main_process_freed_it(tiny_shm):
    data = _photo_bytes(16, (60, 80))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PttWarning)
        loader = ptt.make_loader(data, 4, crop=32, num_workers=1, seed=1, prefetch_factor=1)
    flags = loader.dataloader.dataset.slots.flags
    held = list(loader)  # the loop keeps every batch: the worker must not write over any of them
    snapshot = [x.clone() for x, _ in held]
    assert int(flags.sum()) >= 1
    for x, s in zip(held, snapshot, strict=True):
        assert torch.equal(x[0], s)  # nothing was overwritten while held
    del held, x
    gc.collect()
    assert int(flags.sum()) == 0  # every slot freed once the batches are gone


@pytest.mark.slow
@pytest.mark.skipif(not shm.memfd_available(), reason="no memfd_create on this system")
def test_memory_file_slots_reach_a_spawned_worker():
    """A spawned (or forkserver) worker inherits no descriptor: it opens the file through /proc/<pid>/fd."""
    from pytorchtricks.data.batches import BatchDataset, EpochBatches
    from pytorchtricks.tricks.data.make_loader import _maker

    data = _photo_bytes(8, (60, 80))
    maker = _maker("eval", (32, 32), None, None, None, False, "auto", True)
    slots = BatchSlots(1, 3, backing="memfd", slot_bytes=4 * 32 * 32 * 3)
    sampler = EpochBatches(len(data), 4, False, False, 0, 0, 1)
    dl = torch.utils.data.DataLoader(
        BatchDataset(data, maker, 0, slots), batch_size=None, sampler=sampler, num_workers=1,
        multiprocessing_context="spawn",
    )  # fmt: skip
    got = [x.clone() for x, _ in dl]
    alone = ptt.make_loader(data, 4, crop=32, mode="eval", num_workers=0)
    for a, (b, _) in zip(got, alone, strict=True):
        assert torch.equal(a, b)


def test_a_memory_file_maps_in_a_process_that_did_not_inherit_it(tmp_path):
    if not shm.memfd_available():
        pytest.skip("no memfd_create on this system")
    f = _MemFile(
        "ptt-test", 4096
    )  # a new interpreter (not forked) does not hold its descriptor: /proc/<pid>/fd
    f.view(0, (4,)).copy_(torch.tensor([1, 2, 3, 4], dtype=torch.uint8))
    code = textwrap.dedent(
        f"""
        import pickle
        f = pickle.loads({__import__("pickle").dumps(f)!r})
        print(f.view(0, (4,)).tolist())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[1, 2, 3, 4]"


def test_the_doctor_predicts_a_plain_dataloader_that_will_not_fit(monkeypatch):
    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int):
            return torch.zeros(3, 640, 640), i  # float32: 4.7 MiB a sample

    monkeypatch.setattr(shm, "shm_space", lambda path=shm.SHM_DIR: SMALL)
    import pytorchtricks.analysis.loader_shm as ls

    monkeypatch.setattr(ls, "shm_space", lambda path=shm.SHM_DIR: SMALL)
    state = torch.get_rng_state()
    got = dataloader_shm(torch.utils.data.DataLoader(Images(), 32, shuffle=True, num_workers=2))
    assert torch.equal(torch.get_rng_state(), state)  # the script's random stream is untouched
    assert got is not None and not got["fits"] and got["need_bytes"] > 64 * MIB
    assert "will fail" in got["text"] and "--shm-size" in got["text"]
    fine = dataloader_shm(torch.utils.data.DataLoader(Images(), 1, num_workers=1))
    assert fine is not None and fine["fits"]
    assert dataloader_shm(torch.utils.data.DataLoader(Images(), 32, num_workers=0)) is None


def test_torchs_shm_failures_are_recognised():
    assert is_shm_failure(
        RuntimeError(
            "unable to allocate shared memory(shm) for file </torch_1_2_3>: No space left on device (28)"
        )
    )
    assert is_shm_failure(RuntimeError("DataLoader worker (pid 12) is killed by signal: Bus error. "))
    assert not is_shm_failure(RuntimeError("CUDA out of memory"))


# ------------------------------------------------------------------------------------ a real 64 MB /dev/shm

SCRIPT = """
import json, sys, warnings
import torch
import pytorchtricks as ptt
from torchvision.transforms import v2 as T

folder, coco = sys.argv[1], sys.argv[2]
out = {}
# torch's own DataLoader over the same photos: shows /dev/shm really is too small here (the issue's first case)
tv = torch.utils.data.DataLoader(
    __import__("torchvision").datasets.ImageFolder(folder, T.Compose([T.PILToTensor(), T.RandomResizedCrop(448),
                                                               T.ToDtype(torch.float32, scale=True)])),
    batch_size=32, num_workers=2)
try:
    next(iter(tv))
    out["torch"] = "ok"
except RuntimeError as exc:
    out["torch"] = str(exc)[-400:]
for name, make in (
    ("make_loader", lambda: ptt.make_loader(ptt.JpegFolder(folder), 32, crop=640, num_workers=2, drop_last=False)),
    ("make_detection_loader", lambda: ptt.make_detection_loader(
        ptt.open_detection(coco), 8, ptt.DetectionRecipe.shortest_side(800, 1333),
        ptt.DetectionLoaderConfig(num_workers=2, drop_last=False))),
):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader = make()
    n = 0
    for b in loader:  # a whole epoch
        n += int((b[0] if name == "make_loader" else b.images).shape[0])
    out[name] = {"images": n, "backing": loader.shm.backing, "prefetch": loader.shm.prefetch_factor,
                 "warnings": [str(w.message) for w in said if "/dev/shm" in str(w.message)]}
print("RESULT" + json.dumps(out))
"""


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return "needs util-linux's unshare on Linux"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"],
        capture_output=True,
        text=True,
    )
    return (
        None
        if probe.returncode == 0
        else f"cannot mount a tmpfs in a mount namespace here: {probe.stderr[:120]}"
    )


@pytest.mark.slow
def test_real_photos_through_both_loaders_in_a_64_mb_dev_shm(tmp_path, writers):
    why = _unshare_works()
    if why:
        pytest.skip(why)
    from pytorchtricks.data.photoset import wallpaper_sources

    srcs = wallpaper_sources()
    if len(srcs) < 40:
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    folder = tmp_path / "photos" / "a"
    folder.mkdir(parents=True)
    for k, (_, path) in enumerate(srcs[:40]):  # the real 2-24 MP photos, full size
        os.symlink(path, folder / f"{k:03d}.jpg")
    coco = tmp_path / "coco"
    sizes = [__import__("PIL.Image", fromlist=["Image"]).open(p).size for _, p in srcs[:16]]
    photos = [{"name": f"{k:03d}.jpg", "jpeg": Path(p).read_bytes(), "hw": (h, w),
               "boxes": np.array([[w * 0.1, h * 0.2, w * 0.6, h * 0.7]], np.float32), "labels": np.array([1])}
              for k, ((_, p), (w, h)) in enumerate(zip(srcs[:16], sizes, strict=True))]  # fmt: skip
    writers.coco(coco, photos, split="train")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    cmd = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script} {tmp_path / 'photos'} {coco}"
    res = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.rsplit("RESULT", 1)[1])
    assert "shared memory" in out["torch"]  # the stock loader does fail here: the limit is real
    assert out["make_loader"]["images"] == 40
    assert out["make_detection_loader"]["images"] == 16
    for name in ("make_loader", "make_detection_loader"):
        said = out[name]["warnings"]
        assert said and "do not fit /dev/shm (64 MiB" in said[0], said  # it says what it changed
        assert out[name]["backing"] == "memfd" or out[name]["prefetch"] < 2


def test_doctor_run_says_what_a_scripts_shm_failure_means(tmp_path):
    from pytorchtricks.analysis.script_run import run_script

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for step in range(3):\n"
        "    m(torch.randn(8, 4)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "raise RuntimeError('unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28)')\n"
    )
    with pytest.raises(
        ptt.PttError, match=r"ran out of shared memory \(/dev/shm\) after 3 optimizer step.*--shm-size"
    ):
        run_script([str(script)], steps=5, warmup=0)
    script.write_text("raise RuntimeError('something else')\n")
    with pytest.raises(RuntimeError, match="something else"):  # other errors are the script's own
        run_script([str(script)], steps=5, warmup=0)


@pytest.mark.filterwarnings("ignore:cache_in_ram built the arena")
def test_the_ram_cache_build_fits_its_tasks_beside_the_arena(monkeypatch, tmp_path):
    import pytorchtricks.tricks.data.cache_in_ram as cir

    image = MIB // 2  # a decoded image of the sample's mean size
    monkeypatch.setattr(cir, "shm_space", lambda path=shm.SHM_DIR: SMALL)
    assert cir._build_plan(2, 0.01 * MIB, 0) == (
        2,
        cir.BUILD_BATCH,
    )  # small images: the tasks fit as they are
    with pytest.warns(PttWarning, match="hands 8 images per worker task instead of 64"):
        assert cir._build_plan(2, image, 0) == (2, 8)  # 2 workers x 3 tasks x 8 x 0.5 MiB x 2 = 48 <= 56 MiB
    with pytest.warns(PttWarning, match="decodes in this process"):
        assert cir._build_plan(2, image, 52 * MIB) == (0, cir.BUILD_BATCH)  # 4 MiB left beside the arena
    # and the build through it: the same arena whatever the plan
    data = [(torch.full((3, 40, 50), i, dtype=torch.uint8), i) for i in range(6)]
    monkeypatch.setattr(cir, "_build_plan", lambda workers, image_bytes, arena: (workers, 2))
    cached = ptt.cache_in_ram(data, 16, cache_dir=str(tmp_path), num_workers=1)
    assert [int(cached.read_raw(i)[1]) for i in range(6)] == list(range(6))
    assert [int(cached.read_raw(i)[0][0, 0, 0]) for i in range(6)] == list(range(6))
