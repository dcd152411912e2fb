"""cache_in_ram: pixels equal a fresh decode, refuses budgets it cannot meet (falls back), one copy per node."""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pytest
import torch

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError, PttWarning
from pytorchtricks.data.decode import decode_image
from pytorchtricks.tricks.data.cache_in_ram import (
    ArenaInfo,
    CachedDataset,
    cache_in_ram,
    list_arenas,
    remove_arenas,
)
from pytorchtricks.tricks.data.make_loader import _photo_bytes

# the arena notice is tested below; elsewhere it is noise
pytestmark = pytest.mark.filterwarnings("ignore::pytorchtricks.core.PttWarning")


@pytest.fixture(scope="module")
def jpegs() -> list[tuple[bytes, int]]:
    return [(raw, i) for i, (raw, _) in enumerate(_photo_bytes(12, (60, 80)))]


def test_arena_holds_decoded_resized_pixels(jpegs, tmp_path):
    cached = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    assert isinstance(cached, CachedDataset) and len(cached) == 12
    for i in (0, 5, 11):
        arr, label, _ = cached.read_raw(i)
        assert label == i and arr.shape == (30, 40, 3)  # short side 30, aspect kept
        np.testing.assert_array_equal(arr, decode_image(jpegs[i][0], size=(30, 40)))
    assert cached.nbytes == 12 * 30 * 40 * 3
    clone = pickle.loads(pickle.dumps(cached))  # workers re-map the file by path, they do not copy the pixels
    assert clone._arena is None and np.array_equal(clone.read_raw(3)[0], cached.read_raw(3)[0])


def test_second_call_reuses_the_arena(jpegs, tmp_path):
    a = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    b = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    assert a.path == b.path
    with pytest.warns(NoEffectWarning, match="already cached"):
        assert cache_in_ram(a) is a


def test_refuses_a_budget_it_cannot_meet_and_falls_back(jpegs, tmp_path):
    need = 12 * 30 * 40 * 3
    with pytest.warns(NoEffectWarning, match="refused"):
        out = cache_in_ram(
            jpegs, size=30, budget=need, cache_dir=str(tmp_path), num_workers=0
        )  # no margin left
    assert out is jpegs
    assert not list(tmp_path.iterdir()), "a refused cache must not leave files behind"
    with pytest.raises(PttError, match="raise budget"):
        cache_in_ram(jpegs, size=30, budget=need, cache_dir=str(tmp_path), num_workers=0, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)  # a fallback would warn it
        ok = cache_in_ram(jpegs, size=30, budget=2 * need, cache_dir=str(tmp_path), num_workers=0)
    assert isinstance(ok, CachedDataset)


def test_gives_up_cleanly_when_the_sample_underestimates(tmp_path):
    # one big image among small ones: the sample of 1 sees a small one, the build passes the budget
    small = [(torch.zeros(3, 8, 8, dtype=torch.uint8), i) for i in range(9)]
    data = [*small, (torch.zeros(3, 64, 64, dtype=torch.uint8), 9)]
    with pytest.warns(NoEffectWarning, match="gave up"):
        out = cache_in_ram(data, size=None, budget=3000, cache_dir=str(tmp_path), num_workers=0, sample=1)
    assert out is data and not list(tmp_path.iterdir())


def test_other_local_ranks_map_rank_zero_copy(jpegs, tmp_path, monkeypatch):
    built = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    other = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    assert other.path == built.path  # same file: one copy per node
    # no builder holds the lock and no arena exists (rank 0 died or never came): this rank builds it itself
    alone = cache_in_ram(jpegs, size=20, cache_dir=str(tmp_path), num_workers=0, wait_s=0.2)
    assert alone.read_raw(0)[0].shape == (20, 27, 3) and alone.path != built.path


def test_streams_are_refused(tmp_path):
    class S(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from ()

    with pytest.raises(PttError, match="map-style"):
        cache_in_ram(S(), cache_dir=str(tmp_path))


def test_datasets_over_one_folder_share_one_arena_across_processes(jpegs, tmp_path):
    # the arena's name must not depend on the dataset object: each DDP rank and each later run builds its own
    # JpegFolder, and JpegFolder.path is a method (its repr carries a memory address)
    import subprocess
    import sys

    from pytorchtricks.data.folder import JpegFolder
    from pytorchtricks.tricks.data.cache_in_ram import _key

    for raw, i in jpegs:
        (tmp_path / "photos" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / f"c{i % 2}" / f"{i:02d}.jpg").write_bytes(raw)
    folder = str(tmp_path / "photos")
    a = cache_in_ram(JpegFolder(folder), size=30, cache_dir=str(tmp_path / "cache"), num_workers=0)
    b = cache_in_ram(JpegFolder(folder), size=30, cache_dir=str(tmp_path / "cache"), num_workers=0)
    assert a.path == b.path and len(list((tmp_path / "cache").iterdir())) == 1
    code = (
        "from pytorchtricks.data.folder import JpegFolder\n"
        "from pytorchtricks.tricks.data.cache_in_ram import _key\n"
        f"print(_key(JpegFolder({folder!r}), 30, None))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == _key(JpegFolder(folder), 30, None)


def test_says_where_the_arena_is_its_size_that_it_stays_and_how_to_remove_it(jpegs, tmp_path, monkeypatch):
    with pytest.warns(PttWarning, match="built the arena") as rec:
        a = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    msg = str(rec[0].message)
    assert a.path in msg and "12 images, 42.2 KiB" in msg and "stays after this process exits" in msg
    assert (
        f"`rm -r {a.path}`" in msg and "ptt.remove_arenas" in msg and f"list_arenas({str(tmp_path)!r})" in msg
    )
    assert "RAM" not in msg  # a disk folder, not /dev/shm
    with pytest.warns(PttWarning, match="reuses the arena"):
        cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PttWarning)  # said once per node, by local rank 0
        cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_list_arenas_finds_ready_building_and_abandoned(jpegs, tmp_path):
    assert list_arenas(tmp_path / "none") == []
    a = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    b = cache_in_ram(jpegs[:5], size=None, cache_dir=str(tmp_path), num_workers=0)
    dead = tmp_path / f"{'0' * 16}.tmp{_dead_pid()}"  # a build killed before its rename
    dead.mkdir()
    (dead / "arena.u8").write_bytes(b"x" * 10)
    (tmp_path / f"{'1' * 16}.tmp{os.getpid()}").mkdir()  # a build in progress (this process is alive)
    (tmp_path / "notes").mkdir()  # not an arena: never listed
    found = {x.path: x for x in list_arenas(tmp_path)}
    assert set(found) == {a.path, b.path, *(str(p) for p in tmp_path.glob("*.tmp*"))}
    info = found[a.path]
    assert isinstance(info, ArenaInfo) and (info.state, info.images, info.size) == ("ready", 12, 30)
    assert info.nbytes >= a.nbytes == 12 * 30 * 40 * 3 and info.created > 0 and "builtins.list" in info.source
    assert found[b.path].size is None and found[b.path].images == 5
    assert sorted(x.state for x in found.values()) == ["abandoned", "building", "ready", "ready"]
    assert found[str(dead)].nbytes == 10 and found[str(dead)].pid == int(dead.name.split(".tmp")[1])
    assert (
        ptt.list_arenas is list_arenas and ptt.remove_arenas is remove_arenas and ptt.ArenaInfo is ArenaInfo
    )


def test_remove_arenas_checks_first_and_frees_what_it_lists(jpegs, tmp_path):
    a = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)
    b = cache_in_ram(jpegs, size=20, cache_dir=str(tmp_path), num_workers=0)
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "x.txt").write_text("mine")
    with pytest.raises(PttError, match="not a cache_in_ram arena"):
        remove_arenas([a.path, str(keep)])
    assert os.path.isdir(a.path) and (keep / "x.txt").exists(), "a refused call must remove nothing"
    building = tmp_path / f"{'1' * 16}.tmp{os.getpid()}"
    building.mkdir()
    with pytest.raises(PttError, match="being built by process"):
        remove_arenas(str(building))
    before = a.read_raw(3)[0].copy()
    removed = remove_arenas([a.path])
    assert [r.path for r in removed] == [a.path] and not os.path.exists(a.path)
    assert np.array_equal(a.read_raw(3)[0], before), "a process that mapped the arena keeps reading it"
    (tmp_path / f"{'0' * 16}.tmp{_dead_pid()}").mkdir()
    removed = remove_arenas("all", cache_dir=tmp_path)
    assert sorted(r.state for r in removed) == ["abandoned", "ready"] and b.path in [r.path for r in removed]
    assert [x.state for x in list_arenas(tmp_path)] == ["building"], "a running build is left alone"
    assert (keep / "x.txt").exists()
    c = cache_in_ram(jpegs, size=30, cache_dir=str(tmp_path), num_workers=0)  # rebuilt after removal
    assert np.array_equal(c.read_raw(3)[0], before)


def test_default_cache_dir_is_dev_shm(monkeypatch, tmp_path):
    import pytorchtricks.tricks.data._arena as arena

    assert arena.DEFAULT_DIR == "/dev/shm/ptt-cache"
    monkeypatch.setattr(arena, "DEFAULT_DIR", str(tmp_path))  # never touch the real /dev/shm from a test
    cache_in_ram([(torch.zeros(3, 4, 4, dtype=torch.uint8), 0)], None, cache_dir=str(tmp_path), num_workers=0)
    assert [x.images for x in list_arenas()] == [1]


def test_config_is_the_keywords_as_one_value(jpegs, tmp_path):
    by_kw = cache_in_ram(jpegs, 24, cache_dir=str(tmp_path / "kw"), num_workers=0, sample=4, verify="full")
    cfg = ptt.CacheConfig(cache_dir=str(tmp_path / "cfg"), num_workers=0, sample=4, verify="full")
    by_cfg = cache_in_ram(jpegs, 24, cfg)
    assert by_cfg.path.startswith(str(tmp_path / "cfg")) and len(by_cfg) == len(by_kw) == 12
    assert os.path.basename(by_cfg.path) == os.path.basename(by_kw.path)  # the same content key
    for i in range(12):
        a, b = by_kw.read_raw(i), by_cfg.read_raw(i)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1] == b[1] == i
    with pytest.raises(PttError, match=r"not both \(got num_workers, strict too\)"):
        cache_in_ram(jpegs, 24, cfg, num_workers=1, strict=True)
