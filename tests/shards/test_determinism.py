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
    if fmt == "lmdb":  # LMDB pages depend on the transaction history: compare the records instead
        from pytorchtricks.shards.dataset import ShardDataset

        a, b = ShardDataset(dst, decode=None), ShardDataset(packs[fmt], decode=None)
        assert [a.read_raw(i) for i in range(48)] == [b.read_raw(i) for i in range(48)]
    else:
        assert _shas(dst) == _shas(packs[fmt])
    assert not (dst / ".pack-journal.json").exists()
    assert not [p for p in os.listdir(dst) if ".tmp" in p]


def test_repacking_a_complete_pack_warns_no_effect(photos, packs):
    with pytest.warns(NoEffectWarning, match="already holds this pack"):
        pack(photos, packs["ptt"], format="ptt", shard_size="600KB", workers=0)


def test_different_options_into_a_complete_pack_fail(photos, packs):
    from pytorchtricks.core import PttError

    with pytest.raises(PttError, match="different pack"):
        pack(photos, packs["ptt"], format="ptt", shard_size="1MB", workers=0)
