"""``ptt pack`` under kill -9, dead workers and hostile input: it never hangs, resumes byte-identically, rejects.

Kill tests run a driver in a fresh interpreter: it forks a child per kill point that packs with workers=0 and
SIGKILLs itself right before or after its N-th event (an ``os.replace`` - every rename of a shard, journal, index,
manifest or the LMDB folder -, an LMDB chunk commit or a transaction of the LMDB's canonical write), or in the middle
of a transaction (``mid``: at its N-th LMDB record key, in a chunk, the canonical write or the index read after
it), then re-runs the same pack itself. Each result must equal an uninterrupted pack file for file, manifest
(sha256s) included, with no journal, temp or stale file left.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from _child_run import child_env, run_driver  # tests/shards/ is on sys.path (pytest prepends it)
from PIL import Image

from pytorchtricks.shards.writer import pack

DRIVER = r"""
import json, os, signal, sys, warnings
from pytorchtricks.shards import lmdb_format
from pytorchtricks.shards.writer import pack

a = json.loads(sys.argv[1])
kw = dict(format=a["fmt"], workers=0, **a["options"])
lmdb_format._CANONICAL_TXN_BYTES = a["canonical_txn_bytes"]  # several canonical transactions on a small pack
warnings.simplefilter("ignore")  # "already holds this pack" after a kill past the manifest

def killed_at(dst, when, point):
    pid = os.fork()
    if pid == 0:
        try:
            seen, keys = [0], [0]

            def event(real, name_of):
                def call(*args, **kwargs):
                    seen[0] += 1
                    hit = when != "mid" and (point == seen[0] or point == name_of(args))
                    if hit and when == "before":
                        os.kill(os.getpid(), signal.SIGKILL)
                    out = real(*args, **kwargs)
                    if hit and when == "after":
                        os.kill(os.getpid(), signal.SIGKILL)
                    return out
                return call

            def key(i, real=lmdb_format.sample_key):
                keys[0] += 1
                if when == "mid" and point == keys[0]:  # records put before it, uncommitted
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(i)

            os.replace = event(os.replace, lambda args: os.path.basename(os.fspath(args[1])))
            W = lmdb_format.LmdbWriter
            W.write_chunk = event(W.write_chunk, lambda args: "chunk")
            W._canonical_txn = event(W._canonical_txn, lambda args: "canonical")
            lmdb_format.sample_key = key
            pack(a["src"], dst, **kw)
            print(json.dumps({"events": seen[0], "keys": keys[0]}), flush=True)
            os._exit(0)
        except BaseException as exc:
            print(repr(exc), file=sys.stderr, flush=True)
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

out = []
for dst, when, point in a["points"]:
    killed = killed_at(dst, when, point)
    pack(a["src"], dst, **kw)  # the re-run of the same command
    out.append(killed)
print(json.dumps(out))
"""


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256): the whole pack, byte for byte."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _kill_and_resume(src: Path, base: Path, case: str, points: list[tuple[str, int | str]]) -> list[Path]:
    fmt, options = CASES[case]
    dsts = [base / f"{case}-{when}-{point}" for when, point in points]
    arg = {
        "src": str(src),
        "fmt": fmt,
        "options": options,
        "canonical_txn_bytes": CANONICAL_TXN_BYTES[case],
        "points": [[str(d), when, point] for d, (when, point) in zip(dsts, points, strict=True)],
    }
    killed = run_driver(DRIVER, arg)
    assert all(killed), f"some kill points were never reached: {list(zip(points, killed, strict=True))}"
    return dsts


def _assert_same(dst: Path, ref: Path) -> None:
    assert _tree(dst) == _tree(ref), f"{dst.name} differs from the uninterrupted pack"
    assert not (dst / ".pack-journal.json").exists()
    assert not [p for p in dst.rglob("*") if ".tmp" in p.name]


# case -> (format, pack options). lmdb-small: records of about 1-2 KB, several to an LMDB page, in 16 KB chunks:
# the pages whose free space LMDB reuses unwiped, where a resumed LMDB came out other bytes before it was written
# canonically (a compacting copy, mdb_env_copy2, keeps those bytes); lmdb: the photos' records, one overflow each.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ptt": ("ptt", {"shard_size": "600KB"}),
    "tar": ("tar", {"shard_size": "600KB"}),
    "lmdb": ("lmdb", {"shard_size": "600KB"}),
    "lmdb-small": ("lmdb", {"shard_size": "16KB", "resize": 32}),
}
# Bytes per transaction of the LMDB's canonical write (64 MiB in use): several transactions on these small packs.
CANONICAL_TXN_BYTES = {"ptt": 1 << 20, "tar": 1 << 20, "lmdb": 400_000, "lmdb-small": 12_000}


def _pack_case(src: Path, dst: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The uninterrupted pack of ``case``, as the driver's children pack it."""
    from pytorchtricks.shards import lmdb_format

    fmt, options = CASES[case]
    with monkeypatch.context() as m:
        m.setattr(lmdb_format, "_CANONICAL_TXN_BYTES", CANONICAL_TXN_BYTES[case])
        pack(src, dst, format=fmt, workers=0, **options)


@pytest.fixture(scope="module")
def refs(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Uninterrupted packs of the 48 photos, one per case."""
    base = tmp_path_factory.mktemp("refs")
    with pytest.MonkeyPatch.context() as m:
        for case in CASES:
            _pack_case(photos, base / case, case, m)
    return {case: base / case for case in CASES}


FAST_POINTS: dict[str, list[tuple[str, int | str]]] = {
    "ptt": [
        ("after", 4),
        ("after", "manifest.json"),
    ],  # after 2 shards (+ their journal saves); after the manifest
    "tar": [("after", 5), ("before", "manifest.json")],
    "lmdb": [("after", "data.lmdb"), ("after", 2)],  # right after the rename (was: never completes); 2 chunks
    # after the first commit (was: the same records, another sha256), mid-chunk, mid-canonical-write
    "lmdb-small": [("after", 1), ("mid", 30), ("mid", 60), ("after", "canonical")],
}


@pytest.mark.parametrize("case", CASES)
def test_kill_9_then_rerun_is_byte_identical(photos, refs, tmp_path, case):
    for dst in _kill_and_resume(photos, tmp_path, case, FAST_POINTS[case]):
        _assert_same(dst, refs[case])


@pytest.fixture(scope="module")
def small(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 of the photos (8 per class): the exhaustive kill test runs one pack per kill point."""
    root = tmp_path_factory.mktemp("small")
    for cls in sorted(p for p in photos.iterdir() if p.is_dir()):
        (root / cls.name).mkdir()
        for f in sorted(cls.iterdir())[:8]:
            shutil.copy(f, root / cls.name / f.name)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_kill_9_at_every_rename_and_commit_resumes(small, tmp_path, monkeypatch, case):
    """Every rename and commit (before and after), and for LMDB every record put (mid-transaction)."""
    from pytorchtricks.shards import lmdb_format
    from pytorchtricks.shards.lmdb_format import LmdbWriter

    ref, seen, keys, canonical = tmp_path / "ref", [0], [0], [0]

    def counted(real, n):
        def call(*a, **k):
            n[0] += 1
            return real(*a, **k)

        return call

    with monkeypatch.context() as m:  # the events of one uninterrupted run, as the driver counts them
        m.setattr(os, "replace", counted(os.replace, seen))
        m.setattr(LmdbWriter, "write_chunk", counted(LmdbWriter.write_chunk, seen))
        m.setattr(LmdbWriter, "_canonical_txn", counted(counted(LmdbWriter._canonical_txn, canonical), seen))
        m.setattr(lmdb_format, "sample_key", counted(lmdb_format.sample_key, keys))
        _pack_case(small, ref, case, m)
    n = seen[0]
    assert n >= 6
    points: list[tuple[str, int | str]] = [(w, k) for k in range(1, n + 1) for w in ("before", "after")]
    if CASES[case][0] == "lmdb":
        # each record: put in its chunk, put in the canonical write, read for the index
        assert keys[0] == 3 * 24
        assert canonical[0] >= 3  # the canonical write took several transactions: kills between them too
        points += [("mid", k) for k in range(1, keys[0] + 1)]
    for dst in _kill_and_resume(small, tmp_path, case, points):
        _assert_same(dst, ref)


# ------------------------------------------------------------------------------------------ dead workers


def _workers(proc: psutil.Process) -> list[psutil.Process]:
    """The pack's live spawn workers; a child that exits while it is listed (a zombie not yet reaped, or gone: a
    short-lived helper process) is not one."""
    found = []
    for c in proc.children():
        try:
            if "spawn_main" in " ".join(c.cmdline()):
                found.append(c)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return found


def _cli_pack(src: Path, dst: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "pytorchtricks.cli", "pack", str(src), str(dst), "--format", "tar"]
    return subprocess.Popen(
        [*cmd, "--shard-size", "600KB", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _first_worker(proc: subprocess.Popen[str]) -> tuple[psutil.Process, list[psutil.Process]]:
    main = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        found = _workers(main)
        if found:
            return main, found
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no pack worker appeared (exit {proc.poll()}): {proc.communicate()[1][-2000:]}")


def test_a_killed_worker_fails_the_pack_fast_and_the_rerun_resumes(photos, refs, tmp_path):
    dst = tmp_path / "p"
    proc = _cli_pack(photos, dst, "--workers", "2")
    _, workers = _first_worker(proc)
    os.kill(workers[0].pid, signal.SIGKILL)  # what the OOM killer does
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)  # seconds, not forever (a loaded 2-core box is slow to exit)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # the CLI prints every thread's stack: where it waits
        time.sleep(1.0)
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(
            f"the pack kept running for 30 s after one of its workers was killed; its stacks:\n{err[-6000:]}"
        ) from None
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 2, err[-2000:]
    assert "worker process died" in err and "re-run the same command to resume" in err
    assert not (dst / "manifest.json").exists()
    pack(photos, dst, format="tar", shard_size="600KB", workers=2)
    _assert_same(dst, refs["tar"])


def test_workers_exit_when_the_pack_is_killed(photos, tmp_path):
    proc = _cli_pack(photos, tmp_path / "p", "--workers", "2")
    _, workers = _first_worker(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=10)
    for p in alive:
        p.kill()
    proc.communicate()  # the orphans held its stdout/stderr open: reading them would have hung too
    assert not alive, "pack workers kept running after the packing process was killed"


# ------------------------------------------------------------------------------------------ hostile input


def _jpeg(rgb: tuple[int, int, int] = (120, 60, 200), size: tuple[int, int] = (32, 24)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _reasons(summary: dict) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in summary["rejects"]}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "cls").mkdir(parents=True)
    (src / "cls" / "good.jpg").write_bytes(_jpeg())
    return src


@pytest.mark.timeout(60)  # before the fix open() blocked on the FIFO for good
def test_special_files_are_rejected_without_opening(folder, tmp_path):
    os.mkfifo(folder / "cls" / "fifo.jpg")
    os.symlink("/dev/zero", folder / "cls" / "zero.jpg")  # was: MemoryError ends the pack
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(folder / "cls" / "sock.jpg"))
        s = pack(folder, tmp_path / "out", workers=0)
    finally:
        sock.close()
    reasons = _reasons(s)
    assert s["count"] == 1
    assert reasons["cls/fifo.jpg"] == "not a regular file (FIFO): not opened"
    assert reasons["cls/zero.jpg"] == "not a regular file (character device): not opened"
    assert reasons["cls/sock.jpg"] == "not a regular file (socket): not opened"


def _png_header_only(w: int, h: int) -> bytes:
    """A tiny PNG whose IHDR declares ``w`` x ``h`` RGB (its IDAT holds a few bytes: decoding would fail late)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _jpeg_declaring(w: int, h: int) -> bytes:
    """A real small JPEG with its SOF patched to declare ``w`` x ``h`` (a 629-byte file asking for gigabytes)."""
    b = bytearray(_jpeg())
    i = 2
    while b[i + 1] not in (0xC0, 0xC1, 0xC2):
        i += 2 + int.from_bytes(b[i + 2 : i + 4], "big")
    b[i + 5 : i + 9] = struct.pack(">HH", h, w)
    return bytes(b)


def test_decompression_bombs_are_rejected_from_the_header(folder, tmp_path):
    import resource

    (folder / "cls" / "bomb.png").write_bytes(_png_header_only(20000, 20000))
    (folder / "cls" / "bomb.jpg").write_bytes(_jpeg_declaring(65500, 65500))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = pack(folder, tmp_path / "out", workers=0)
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    reasons = _reasons(s)
    assert s["count"] == 1
    assert reasons["cls/bomb.png"].startswith("decompression bomb: the header declares 20000x20000 = 400 MP")
    assert reasons["cls/bomb.jpg"].startswith("decompression bomb: the header declares 65500x65500 = 4290 MP")
    assert "budget of 179 MP" in reasons["cls/bomb.jpg"]
    assert grew_mb < 200, f"rejecting two bombs grew the peak RSS by {grew_mb:.0f} MB: they were decoded"
    small = pack(folder, tmp_path / "small", workers=0, max_pixels=500)  # the budget is an option
    assert _reasons(small)["cls/good.jpg"].startswith("decompression bomb: the header declares 32x24 = 0 MP")


def _decoded(dst: Path) -> list[np.ndarray]:
    from pytorchtricks.data.decode import decode_image
    from pytorchtricks.shards.dataset import ShardDataset

    ds = ShardDataset(dst, decode=None)
    return [decode_image(bytes(ds.read_raw(i)[0]), backend="pil") for i in range(len(ds))]


def test_16_bit_grey_png_keeps_its_brightness(tmp_path):
    src = tmp_path / "src"
    (src / "cls").mkdir(parents=True)
    grey = (np.arange(64 * 48, dtype=np.uint32).reshape(48, 64) * 65535 // (64 * 48 - 1)).astype(np.uint16)
    Image.fromarray(grey).save(src / "cls" / "g16.png")  # mode I;16
    assert Image.open(src / "cls" / "g16.png").mode in ("I;16", "I")
    s = pack(src, tmp_path / "out", workers=0, shuffle=False)
    assert s["count"] == 1 and s["rejects"] == []
    (img,) = _decoded(tmp_path / "out")
    assert img.shape == (48, 64, 3)
    assert abs(float(img.mean()) - float(grey.mean()) / 257) < 1  # was 254.5 (clipped to white) for ~127.5
    assert int(img.min()) == 0 and int(img.max()) == 255


def test_gif_tiff_and_other_modes_are_converted_to_rgb(tmp_path):
    src = tmp_path / "src"
    (src / "cls").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(src / "cls" / "a.tiff")
    frames = [Image.new("P", (30, 20), k) for k in (3, 9)]
    frames[0].save(src / "cls" / "b.gif", save_all=True, append_images=frames[1:])
    Image.fromarray(rgb).convert("CMYK").save(src / "cls" / "c.tiff")
    s = pack(src, tmp_path / "out", workers=0, shuffle=False)
    assert s["count"] == 3 and s["rejects"] == [], s["rejects"]  # were: "not an image"
    tiff, gif, cmyk = _decoded(tmp_path / "out")
    np.testing.assert_array_equal(tiff, rgb)
    np.testing.assert_array_equal(gif, np.asarray(frames[0].convert("RGB")))  # the first frame
    np.testing.assert_array_equal(cmyk, np.asarray(Image.open(src / "cls" / "c.tiff").convert("RGB")))


def test_every_skipped_file_is_listed_in_rejects(folder, tmp_path, monkeypatch):
    (folder / "cls" / ".hidden.jpg").write_bytes(_jpeg())
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.jpg").write_bytes(_jpeg())
    (folder / "root.jpg").write_bytes(_jpeg())
    (folder / "cls" / "deep" / ".git").mkdir(parents=True)
    locked = folder / "cls" / "locked"
    locked.mkdir()
    (locked / "in_locked.jpg").write_bytes(_jpeg())
    os.symlink(folder / "cls" / "deep", folder / "cls" / "loop")
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads a mode-000 folder anyway: make listing it fail as it does for users
        real = os.scandir

        def scandir(path=".", *a, **k):
            if os.fspath(path) == str(locked):
                raise PermissionError(13, "Permission denied", str(locked))
            return real(path, *a, **k)

        monkeypatch.setattr(os, "scandir", scandir)
    try:
        s = pack(folder, tmp_path / "out", workers=0)
    finally:
        locked.chmod(0o755)
    reasons = _reasons(s)
    assert s["count"] == 1
    assert reasons == {
        ".cache/": "hidden (name starts with '.'): not packed",
        "cls/.hidden.jpg": "hidden (name starts with '.'): not packed",
        "cls/deep/.git/": "hidden (name starts with '.'): not packed",
        "cls/locked/": "unreadable folder (Permission denied): fix its permissions and re-run",
        "cls/loop": "symlink to a folder: not followed (it could loop)",
        "root.jpg": "not in a class folder (ImageFolder layout: SRC/<class>/<image>)",
    }
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["rejects"] == s["rejects"]


def test_stale_files_of_an_abandoned_pack_are_removed(photos, refs, tmp_path):
    dst = tmp_path / "p"
    (dst / "data.lmdb.tmp").mkdir(parents=True)  # an LMDB pack abandoned in the same folder
    pack(photos, tmp_path / "other", format="ptt", shard_size="200KB", workers=0)  # more, smaller shards
    for f in (tmp_path / "other").iterdir():
        if f.name.startswith("shard-"):
            shutil.copy(f, dst / f.name)
    (dst / "shard-000000.tar").write_bytes(b"old")
    (dst / "notes.txt").write_text("the user's own file")
    pack(photos, dst, format="ptt", shard_size="600KB", workers=0)
    assert _tree(dst) == {
        **_tree(refs["ptt"]),
        "notes.txt": hashlib.sha256(b"the user's own file").hexdigest(),
    }


def test_corrupt_jpegs_are_still_rejects_and_nothing_else_is_lost(truncated_src, tmp_path):
    src, good = truncated_src
    s = pack(src, tmp_path / "out", workers=0)
    assert s["count"] == len(good)
    assert list(_reasons(s)) == ["mate/truncated.jpg"]
    assert s["bytes_in"] == sum(p.stat().st_size for p in src.rglob("*.jpg"))


def test_the_pixel_budget_is_a_cli_option(folder, tmp_path, capsys):
    from pytorchtricks.cli import main

    assert main(["pack", str(folder), str(tmp_path / "cli"), "--workers", "0", "--max-pixels", "500"]) == 0
    out = capsys.readouterr().out
    assert "rejects: 1" in out and "over the budget of" in out
