"""cache_in_ram's arena is keyed by content, checked before reuse, and safe with concurrent or dying builders.

Each test reproduces a finding of the hostile-user probe (issue 20, item 4): arenas shared by different data,
arenas planted by another user or damaged and served anyway, builders that hang the others or collide.
Every test uses its own arena root (``cache_dir=tmp_path``): none touches /dev/shm/ptt-cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import pytorchtricks.tricks.data._arena as arena
from pytorchtricks.core import PttError, PttWarning
from pytorchtricks.tricks.data._arena import ArenaError, ArenaWriter, CachedDataset, build_lock
from pytorchtricks.tricks.data.cache_in_ram import _content, cache_in_ram

pytestmark = pytest.mark.filterwarnings("ignore::pytorchtricks.core.PttWarning")

NOBODY = 65534


def _images(n: int, base: int = 0, label: int | None = None) -> list[tuple[torch.Tensor, int]]:
    """n CHW uint8 images, image i filled with (base + i) % 256 (odd sizes), label i unless given."""
    return [
        (torch.full((3, 5 + i % 3, 7), (base + i) % 256, dtype=torch.uint8), i if label is None else label)
        for i in range(n)
    ]


def _assert_holds(cached: CachedDataset, data: list[tuple[torch.Tensor, int]]) -> None:
    """The arena holds exactly ``data`` (size=None: the stored pixels, HWC)."""
    assert isinstance(cached, CachedDataset) and len(cached) == len(data)
    for i, (img, label) in enumerate(data):
        arr, got, _ = cached.read_raw(i)
        np.testing.assert_array_equal(arr, img.permute(1, 2, 0).numpy())
        assert got == label


def _leftovers(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if ".tmp" in p.name or p.name.endswith(".lock"))


def test_two_in_memory_datasets_of_one_length_get_their_own_arenas(tmp_path):
    # before: the key was (type, path, root, len): the second list got the first one's pixels and labels
    a, b = _images(20), _images(20, base=100, label=3)
    ca = cache_in_ram(a, None, cache_dir=str(tmp_path), num_workers=0)
    cb = cache_in_ram(b, None, cache_dir=str(tmp_path), num_workers=0)
    assert ca.path != cb.path
    _assert_holds(ca, a)
    _assert_holds(cb, b)
    changed = [*a[:-1], (a[-1][0].clone().fill_(7), a[-1][1])]  # one pixel value of one record changed
    assert cache_in_ram(changed, None, cache_dir=str(tmp_path), num_workers=0).path not in (ca.path, cb.path)
    relabelled = [*a[:-1], (a[-1][0], 99)]
    assert _content(relabelled, None, None) != _content(a, None, None)
    assert _content(a, 4, None) != _content(a, None, None)  # the size is part of it
    assert cache_in_ram(a, None, cache_dir=str(tmp_path), num_workers=0).path == ca.path  # same data: reused


def test_a_folder_dataset_changed_on_disk_gets_a_new_arena(tmp_path):
    from pytorchtricks.data.folder import JpegFolder
    from pytorchtricks.tricks.data.make_loader import _photo_bytes

    photos = tmp_path / "photos" / "c0"
    photos.mkdir(parents=True)
    raws = [raw for raw, _ in _photo_bytes(3, (20, 24))]
    for i, raw in enumerate(raws[:2]):
        (photos / f"{i}.jpg").write_bytes(raw)
    before = _content(JpegFolder(str(tmp_path / "photos")), 16, None)
    (photos / "1.jpg").write_bytes(raws[2])  # same name and count, other pixels
    os.utime(photos / "1.jpg", ns=(1, 1))
    assert _content(JpegFolder(str(tmp_path / "photos")), 16, None) != before


def test_a_torchvision_image_folder_is_keyed_by_its_files_without_reading_them(tmp_path, monkeypatch):
    from torchvision import datasets

    from pytorchtricks.tricks.data.make_loader import _photo_bytes

    photos = tmp_path / "photos" / "c0"
    photos.mkdir(parents=True)
    raws = [raw for raw, _ in _photo_bytes(3, (20, 24))]
    for i, raw in enumerate(raws[:2]):
        (photos / f"{i}.jpg").write_bytes(raw)
    ds = datasets.ImageFolder(str(tmp_path / "photos"))
    monkeypatch.setattr(type(ds), "__getitem__", lambda self, i: pytest.fail("the digest read a record"))
    before = _content(ds, 16, None)
    (photos / "1.jpg").write_bytes(raws[2])  # same name and count, other pixels
    os.utime(photos / "1.jpg", ns=(1, 1))
    assert _content(datasets.ImageFolder(str(tmp_path / "photos")), 16, None) != before


def test_packs_of_one_length_get_their_own_arenas_and_one_pack_keeps_its_own(tmp_path):
    from PIL import Image

    import pytorchtricks as ptt

    packs = []
    for shade in (10, 200):
        src = tmp_path / f"src{shade}" / "dog"
        src.mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (20, 16), (shade, i, 0)).save(src / f"{i}.jpg")
        ptt.pack(str(src.parent), str(tmp_path / f"pack{shade}"), workers=0)
        packs.append(str(tmp_path / f"pack{shade}"))
    a, b = (cache_in_ram(ptt.ShardDataset(p), 8, cache_dir=str(tmp_path / "c"), num_workers=0) for p in packs)
    assert a.path != b.path and int(a.read_raw(0)[0][..., 0].mean()) < 50 < int(
        b.read_raw(0)[0][..., 0].mean()
    )
    again = cache_in_ram(ptt.ShardDataset(packs[0]), 8, cache_dir=str(tmp_path / "c"), num_workers=0)
    assert again.path == a.path  # a new ShardDataset over the same pack: the same arena


def _plant(path, data, content: str) -> None:
    """Write a well-formed arena holding ``data`` under the name and digest of other data, as an attacker would."""
    path.mkdir(mode=0o755)
    w = ArenaWriter(str(path), len(data))
    for i, (img, label) in enumerate(data):
        w.add(i, img.permute(1, 2, 0).numpy(), label)
    w.finish(None, "planted", content)


def _chown_tree(path, uid: int) -> None:
    os.chown(path, uid, uid)
    for f in path.iterdir():
        os.chown(f, uid, uid)


def test_an_arena_planted_by_another_user_is_never_served(tmp_path):
    # before: an arena of `nobody` (all pixels red, every label 3) under the victim's key was returned as is
    data = _images(10)
    content = _content(data, None, None)
    evil = [(torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1, 1).expand(3, 5, 7).clone(), 3)] * 10
    _plant(tmp_path / content[:16], evil, content)
    _chown_tree(tmp_path / content[:16], NOBODY)
    with pytest.raises(ArenaError, match="owned by uid 65534"):
        CachedDataset(str(tmp_path / content[:16]))
    with pytest.warns(PttWarning, match="rebuilds the arena .* owned by uid 65534"):
        got = cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0)
    _assert_holds(got, data)
    assert os.stat(got.path).st_uid == os.getuid() and _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("target", "change"),
    [
        ("", "chown"),
        ("arena.u8", "chown"),
        ("index.json", "chown"),
        ("", "o+w"),
        ("index.npy", "g+w"),
        ("arena.u8", "o+w"),
    ],
)
def test_an_arena_others_own_or_may_write_is_rebuilt(tmp_path, target, change):
    data = _images(6)
    built = cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0)
    victim = os.path.join(built.path, target) if target else built.path
    if change == "chown":
        os.chown(victim, NOBODY, NOBODY)
    else:
        os.chmod(victim, os.stat(victim).st_mode | (0o020 if change == "g+w" else 0o002))
    with pytest.warns(PttWarning, match="rebuilds the arena"):
        again = cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0)
    _assert_holds(again, data)
    for name in ("", *arena.FILES):
        st = os.stat(os.path.join(again.path, name))
        assert st.st_uid == os.getuid() and not st.st_mode & 0o022


def test_a_shared_world_writable_folder_is_not_trusted(tmp_path):
    # before: in a mode-1777 folder, another user's arena under our key was served to root
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    data = _images(8)
    content = _content(data, None, None)
    _plant(shared / content[:16], _images(8, base=50, label=3), content)
    _chown_tree(shared / content[:16], NOBODY)
    with pytest.warns(PttWarning, match="does not trust .*shared"):
        got = cache_in_ram(data, None, cache_dir=str(shared), num_workers=0)
    _assert_holds(got, data)
    assert os.path.dirname(got.path) == f"{shared}-{os.getuid()}"
    assert os.stat(os.path.dirname(got.path)).st_mode & 0o777 == 0o700
    # the private sibling planted too (owned by nobody): refused with the fix, nothing served
    other = tmp_path / "other"
    other.mkdir()
    os.chmod(other, 0o777)
    (tmp_path / f"other-{os.getuid()}").mkdir()
    os.chown(tmp_path / f"other-{os.getuid()}", NOBODY, NOBODY)
    with pytest.raises(PttError, match="Pass cache_dir= a folder you own"):
        cache_in_ram(data, None, cache_dir=str(other), num_workers=0)


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))


def _damage(path: str, how: str) -> None:
    data, index, meta = (os.path.join(path, n) for n in arena.FILES)
    if how == "flip pixel":
        _flip(data, os.path.getsize(data) // 2)
    elif how == "truncate data":
        os.truncate(data, os.path.getsize(data) - 5)
    elif how == "flip index":
        _flip(index, os.path.getsize(index) - 3)
    elif how == "garbage json":
        with open(meta, "wb") as fh:
            fh.write(b"\x00{not json")
    elif how == "edited json":  # valid JSON, plausible values: only its own checksum tells
        with open(meta, encoding="utf-8") as fh:
            doc = json.load(fh)
        doc["count"] -= 1
        with open(meta, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    elif how == "json list":
        with open(meta, "w", encoding="utf-8") as fh:
            fh.write("[1, 2]")
    elif how.startswith("missing "):
        os.remove({"missing json": meta, "missing index": index, "missing data": data}[how])
    else:
        raise AssertionError(how)


DAMAGES = [
    "flip pixel",
    "truncate data",
    "flip index",
    "garbage json",
    "edited json",
    "json list",
    "missing json",
    "missing index",
    "missing data",
]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_arena_is_refused_then_rebuilt_never_served(tmp_path, how):
    # before: 44 of 200 images differed silently, or ValueError / FileNotFoundError / JSONDecodeError
    data = _images(40)
    built = cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0)
    _damage(built.path, how)
    with pytest.raises(ArenaError):  # a PttError naming the file, never another exception
        CachedDataset(built.path)
    with pytest.warns(PttWarning, match="rebuilds the arena"):
        again = cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0)
    _assert_holds(again, data)
    assert _leftovers(tmp_path) == [] and [p.name for p in tmp_path.iterdir()] == [
        os.path.basename(built.path)
    ]


def test_full_check_finds_a_flip_in_any_block_sampled_always_reads_the_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(arena, "BLOCK_BYTES", 64)  # many small blocks: 40 images x ~130 bytes -> ~80 blocks
    monkeypatch.setattr(arena, "SAMPLE_BLOCKS", 4)
    built = cache_in_ram(_images(40), None, cache_dir=str(tmp_path), num_workers=0)
    blocks = len(built.meta["block_crc32"])
    assert blocks > 20 and built.meta["block_bytes"] == 64
    data = os.path.join(built.path, "arena.u8")
    _flip(data, 64 * (blocks // 2) + 3)
    CachedDataset(built.path, verify="none")  # metadata and index are intact: only the pixels are wrong
    with pytest.raises(ArenaError, match=f"damaged: 1 of {blocks} checked blocks of 64 bytes"):
        CachedDataset(built.path, verify="full")
    with pytest.raises(ArenaError, match="damaged"):  # auto: small arena, every block
        CachedDataset(built.path)
    _flip(data, 64 * (blocks // 2) + 3)  # undo
    _flip(data, os.path.getsize(data) - 1)  # the last block: a sample always reads it
    with pytest.raises(ArenaError, match="1 of 4 checked"):
        CachedDataset(built.path, verify="sample")


def test_build_lock_admits_one_holder_at_a_time(tmp_path, run_threads):
    holders, most = [0], [0]
    guard = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            with build_lock(str(tmp_path), "0" * 16, wait_s=30):
                with guard:
                    holders[0] += 1
                    most[0] = max(most[0], holders[0])
                time.sleep(0.001)
                with guard:
                    holders[0] -= 1

    errors = run_threads(worker, 4)
    assert errors == [] and most[0] == 1 and _leftovers(tmp_path) == []


def test_a_live_builder_is_waited_for_then_named(tmp_path):
    data = _images(4)
    key = _content(data, None, None)[:16]
    waited = pytest.raises(PttError, match=f"waited 0 s for process {os.getpid()} to build")
    with build_lock(str(tmp_path), key, wait_s=1), waited:  # another file description: as another builder
        cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0, wait_s=0.3)
    _assert_holds(cache_in_ram(data, None, cache_dir=str(tmp_path), num_workers=0, wait_s=0.3), data)


SCRIPT = """
import hashlib, json, os, sys, time, warnings
import torch
from pytorchtricks.tricks.data.cache_in_ram import cache_in_ram

class Slow(torch.utils.data.Dataset):
    def __init__(self, n, pause_s):
        self.n, self.pause_s = n, pause_s
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(self.pause_s)
        return torch.full((3, 6, 4 + i % 3), i % 256, dtype=torch.uint8), i

root, n, pause_s, key = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] or None
print("start", flush=True)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    c = cache_in_ram(Slow(n, pause_s), None, cache_dir=root, num_workers=0, key=key, sample=1)
h = hashlib.sha256()
for i in range(len(c)):
    arr, label, _ = c.read_raw(i)
    h.update(arr.tobytes() + str(label).encode())
built = any("built the arena" in str(w.message) for w in seen)
print(json.dumps({"path": c.path, "digest": h.hexdigest(), "built": built}), flush=True)
"""


def _expected_digest(n: int) -> str:
    h = hashlib.sha256()
    for i in range(n):
        h.update(np.full((6, 4 + i % 3, 3), i % 256, dtype=np.uint8).tobytes() + str(i).encode())
    return h.hexdigest()


def _start(tmp_path, root, n: int, pause_s: float, key: str = "") -> subprocess.Popen[str]:
    script = tmp_path / "builder.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "LOCAL_RANK": "0"}  # both believe they are local rank 0
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(n), str(pause_s), key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _result(proc: subprocess.Popen[str], timeout_s: float) -> dict:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1])


@pytest.mark.slow  # two interpreters importing torch: ~9 s on 2 cores
def test_two_processes_building_one_arena_at_once_get_one_correct_arena(tmp_path):
    # before: the second builder failed `OSError: [Errno 39] Directory not empty` (4 of 4)
    root = tmp_path / "cache"
    procs = [_start(tmp_path, root, 30, 0.02) for _ in range(2)]
    results = [_result(p, 120) for p in procs]
    assert results[0]["path"] == results[1]["path"]
    assert results[0]["digest"] == results[1]["digest"] == _expected_digest(30)
    assert sorted(r["built"] for r in results) == [False, True]  # one built, the other waited and reused
    assert [p.name for p in root.iterdir()] == [os.path.basename(results[0]["path"])]


@pytest.mark.slow  # two interpreters importing torch: ~9 s on 2 cores
def test_a_builder_killed_mid_build_is_taken_over_within_seconds(tmp_path):
    # before: the other ranks waited the full wait_s (3600 s) and the dead build's folder stayed behind
    root = tmp_path / "cache"
    victim = _start(tmp_path, root, 400, 0.05, key="sigkill")  # a 20 s build: killed long before its end
    try:
        for _ in range(600):  # counted pauses (up to 60 s for the interpreter to start and begin writing)
            if root.is_dir() and any(".tmp" in p.name for p in root.iterdir()):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the builder never started its build")
        waiter = _start(tmp_path, root, 400, 0.0, key="sigkill")
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "start"
        time.sleep(1.0)  # the waiter reaches the lock: key= is given, no digest to compute
        assert victim.poll() is None, "the build finished before it could be killed"
        t0 = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        got = _result(waiter, 60)
        took_s = time.monotonic() - t0
    finally:
        victim.kill()
    assert took_s < 20, f"took over after {took_s:.1f} s"
    assert got["digest"] == _expected_digest(400) and got["built"]
    assert [p.name for p in root.iterdir()] == [os.path.basename(got["path"])], "no temp folder or lock left"


def test_metadata_with_its_checksum_but_wrong_fields_is_refused_not_a_keyerror(tmp_path):
    from pytorchtricks.tricks.data._arena import _meta_check

    built = cache_in_ram(_images(3), None, cache_dir=str(tmp_path), num_workers=0)
    meta_path = os.path.join(built.path, "index.json")
    with open(meta_path, encoding="utf-8") as fh:
        meta = json.load(fh)
    for broken in ({"block_crc32": "x"}, {"block_bytes": 0}, {"count": "3"}, {"content": None}):
        doc = {**meta, **broken}
        doc["check"] = _meta_check(doc)  # a consistent checksum: only the field checks can tell
        with open(meta_path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        with pytest.raises(ArenaError, match="lacks fields"):
            CachedDataset(built.path)
    del meta["block_crc32"]
    meta["check"] = _meta_check(meta)
    with open(meta_path, "w", encoding="utf-8") as fh:
        json.dump(meta, fh)
    with pytest.raises(ArenaError, match="lacks fields"):
        CachedDataset(built.path)
    with pytest.raises(PttError, match="verify='quick'"):
        cache_in_ram(_images(3), None, cache_dir=str(tmp_path), verify="quick")  # type: ignore[arg-type]
