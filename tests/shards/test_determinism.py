"""Same input and options -> byte-identical shards; an interrupted pack resumes to the same result."""

from __future__ import annotations

import json
import os

import pytest

from pytorchtricks.core import NoEffectWarning
from pytorchtricks.shards.writer import pack


def _shas(dst) -> list[str]:
    return [s["sha256"] for s in json.loads((dst / "manifest.json").read_text())["shards"]]


@pytest.mark.parametrize("fmt", ["ptt", "tar", "lmdb"])
def test_two_packs_are_identical(photos, packs, tmp_path, fmt):
    again = pack(photos, tmp_path / "again", format=fmt, shard_size="600KB", workers=2)
    assert [s["sha256"] for s in again["shards"]] == _shas(packs[fmt])
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (packs[fmt] / "manifest.json").read_bytes()


def _interrupt_after(monkeypatch, fmt: str, n: int) -> None:
    """Make the pack die (as on Ctrl-C / kill) when it tries to write its (n+1)-th shard."""
    from pytorchtricks.shards import writer

    name = {"ptt": "write_ptt_shard", "tar": "write_tar_shard"}.get(fmt)
    calls = {"n": 0}
    if name is None:
        real = writer.LmdbWriter.write_chunk

        def chunk(self, *a, **k):
            calls["n"] += 1
            if calls["n"] > n:
                raise KeyboardInterrupt
            return real(self, *a, **k)

        monkeypatch.setattr(writer.LmdbWriter, "write_chunk", chunk)
        return
    real_fn = getattr(writer, name)

    def write(path, *a, **k):
        calls["n"] += 1
        if calls["n"] > n:
            with open(f"{path}.tmp{os.getpid()}", "wb") as fh:  # a half-written temp file, as a kill leaves
                fh.write(b"partial")
            raise KeyboardInterrupt
        return real_fn(path, *a, **k)

    monkeypatch.setattr(writer, name, write)


@pytest.mark.parametrize("fmt", ["ptt", "tar", "lmdb"])
def test_interrupted_pack_resumes_and_matches(photos, packs, tmp_path, monkeypatch, fmt):
    dst = tmp_path / "p"
    with monkeypatch.context() as m:
        _interrupt_after(m, fmt, 2)
        with pytest.raises(KeyboardInterrupt):
            pack(photos, dst, format=fmt, shard_size="600KB", workers=0)
    assert not (dst / "manifest.json").exists()
    done = sorted(p for p in os.listdir(dst) if p.startswith("shard-") and "tmp" not in p)
    before = {n: os.stat(dst / n).st_mtime_ns for n in done}
    s = pack(photos, dst, format=fmt, shard_size="600KB", workers=0)
    assert s["skipped_shards"] == 2 and s["count"] == 48
    assert {n: os.stat(dst / n).st_mtime_ns for n in done} == before  # complete shards are not rewritten
    assert _shas(dst) == _shas(packs[fmt])  # LMDB too: its file is written canonically, whatever its history
    assert (dst / "manifest.json").read_bytes() == (packs[fmt] / "manifest.json").read_bytes()
    assert not (dst / ".pack-journal.json").exists()
    assert not [p for p in os.listdir(dst) if ".tmp" in p]


def test_repacking_a_complete_pack_warns_no_effect(photos, packs):
    with pytest.warns(NoEffectWarning, match="already holds this pack"):
        pack(photos, packs["ptt"], format="ptt", shard_size="600KB", workers=0)


def test_different_options_into_a_complete_pack_fail(photos, packs):
    from pytorchtricks.core import PttError

    with pytest.raises(PttError, match="different pack"):
        pack(photos, packs["ptt"], format="ptt", shard_size="1MB", workers=0)


@pytest.mark.parametrize("damage", ["none", "truncated", "not-lmdb"])
def test_an_interrupted_lmdb_canonical_write_resumes_to_the_same_bytes(photos, tmp_path, monkeypatch, damage):
    """Stopped after two transactions of the canonical write (and its part then damaged, or not), the re-run
    continues it (or rewrites a damaged part) to the uninterrupted pack's bytes."""
    from pytorchtricks.shards import lmdb_format

    W, calls, stop_at = lmdb_format.LmdbWriter, [0], [0]
    real = W._canonical_txn

    def txn(self, *a):
        calls[0] += 1
        if calls[0] == stop_at[0]:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(lmdb_format, "_CANONICAL_TXN_BYTES", 1 << 20)  # about 5 transactions, 48 photos
    monkeypatch.setattr(W, "_canonical_txn", txn)
    ref = pack(photos, tmp_path / "ref", format="lmdb", shard_size="600KB", workers=0)
    whole = calls[0]
    assert whole >= 4
    dst, calls[0], stop_at[0] = tmp_path / "p", 0, 3
    with pytest.raises(KeyboardInterrupt):
        pack(photos, dst, format="lmdb", shard_size="600KB", workers=0)
    part = dst / "data.lmdb.tmp" / "canonical" / "data.mdb"
    if damage == "truncated":
        with open(part, "r+b") as fh:
            fh.truncate(3 * 4096)
    elif damage == "not-lmdb":
        part.write_bytes(b"not an LMDB" * 1000)
    calls[0], stop_at[0] = 0, 0
    s = pack(photos, dst, format="lmdb", shard_size="600KB", workers=0)
    if damage == "none":  # the two committed transactions are not written again
        assert calls[0] == whole - 2
    assert s["shards"] == ref["shards"]
    assert (dst / "manifest.json").read_bytes() == (tmp_path / "ref" / "manifest.json").read_bytes()
    assert sorted(os.listdir(dst / "data.lmdb")) == ["data.mdb"]  # no lock file: readers open it lock=False
    assert not [p for p in os.listdir(dst) if ".tmp" in p]
