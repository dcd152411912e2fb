"""Bad files while packing become rejects (or fail with --strict); bad shards raise ShardError or are skipped."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.stream import ShardStream
from pytorchtricks.shards.writer import pack


@pytest.fixture
def dirty_src(truncated_src):
    src, good = truncated_src
    data = good[0].read_bytes()
    flipped = bytearray(data)
    flipped[200:400] = bytes(200)  # zero a run inside the entropy-coded data
    (src / "mate" / "zeroed_header.jpg").write_bytes(bytes(flipped[:30]) + bytes(64))
    (src / "mate" / "notes.txt").write_text("not an image")
    (src / "mate" / "fake.jpg").write_bytes(b"\xff\xd8\xff" + os.urandom(100))
    os.symlink(src / "missing.jpg", src / "mate" / "dangling.jpg")  # unreadable: open() fails
    return src, len(good)


def test_bad_files_become_rejects(dirty_src, tmp_path):
    src, n_good = dirty_src
    s = pack(src, tmp_path / "out", workers=0)
    assert s["count"] == n_good
    reasons = {r["path"]: r["reason"] for r in s["rejects"]}
    assert set(reasons) == {
        f"mate/{n}" for n in ("truncated.jpg", "zeroed_header.jpg", "notes.txt", "fake.jpg", "dangling.jpg")
    }
    assert reasons["mate/notes.txt"].startswith("not an image")
    assert reasons["mate/dangling.jpg"].startswith("unreadable")
    assert reasons["mate/truncated.jpg"].startswith("not decodable")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["rejects"]) == 5


def test_strict_fails_on_first_bad_file(dirty_src, tmp_path):
    with pytest.raises(PttError, match="drop --strict"):
        pack(dirty_src[0], tmp_path / "out", workers=0, strict=True)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_parallel_pack_rejects_too(dirty_src, tmp_path):
    s = pack(dirty_src[0], tmp_path / "out", workers=2, format="tar")
    assert len(s["rejects"]) == 5 and s["count"] == dirty_src[1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "zip"}, "unknown format"),
        ({"raw": True, "quality": 80}, "drop --quality"),
        ({"shard_size": "lots"}, "64MB"),
        ({"quality": 0}, "1..100"),
        ({"resize": 0}, "positive"),
    ],
)
def test_misuse_errors_say_the_fix(photos, tmp_path, kwargs, match):
    with pytest.raises(PttError, match=match):
        pack(photos, tmp_path / "out", workers=0, **kwargs)


def test_missing_source(tmp_path):
    with pytest.raises(PttError, match="does not exist"):
        pack(tmp_path / "nope", tmp_path / "out")


def _first_shard(dst):
    return sorted(p for p in dst.iterdir() if p.name.startswith("shard-"))[0]


def test_truncated_shard_names_file(pack_copy):
    dst = pack_copy("ptt")
    shard = _first_shard(dst)
    shard.write_bytes(shard.read_bytes()[:-5000])
    ds = ShardDataset(dst, decode=None)
    with pytest.raises(ShardError, match=shard.name):
        for i in range(len(ds)):
            ds[i]


def test_flipped_bytes_fail_crc_and_skip(pack_copy):
    dst = pack_copy("ptt")
    shard = _first_shard(dst)
    raw = bytearray(shard.read_bytes())
    raw[-1000] ^= 0xFF  # inside the last record of the shard
    shard.write_bytes(bytes(raw))
    ds = ShardDataset(dst, decode=None)
    bad = [i for i in range(len(ds)) if ds._rows()[i]["shard"] == 0][-1]
    with pytest.raises(ShardError, match=rf"CRC32 mismatch.*|{shard.name}.*record {bad}"):
        ds[bad]
    skipping = ShardDataset(dst, decode=None, on_error="skip")
    with pytest.warns(UserWarning, match="skipped a bad sample"):
        data, _, _ = skipping[bad]
    assert data == ds[(bad + 1) % len(ds)][0]
    stream = ShardStream(dst, decode=None, on_error="skip")
    with pytest.warns(UserWarning, match="CRC32"):
        assert len(list(stream)) == len(ds) - 1


def test_missing_shard(pack_copy):
    for fmt in ("ptt", "tar"):
        dst = pack_copy(fmt)
        shard = _first_shard(dst)
        os.remove(shard)
        with pytest.raises(ShardError, match="missing"):
            list(ShardStream(dst, decode=None, shuffle=False))
        with pytest.warns(UserWarning):
            got = list(ShardStream(dst, decode=None, shuffle=False, on_error="skip"))
        manifest = json.loads((dst / "manifest.json").read_text())
        assert len(got) == manifest["count"] - manifest["shards"][0]["count"]


def test_index_shard_mismatch(pack_copy):
    dst = pack_copy("ptt")
    index = np.load(dst / "index.npy")
    np.save(dst / "index.npy", index[:-1])
    with pytest.raises(ShardError, match="index and shards do not match"):
        ShardDataset(dst)
    index["offset"][3] += 10**9
    np.save(dst / "index.npy", index)
    with pytest.raises(ShardError, match="record 3"):
        ShardDataset(dst, decode=None)[3]


def test_lmdb_corrupt_value(pack_copy):
    import lmdb

    dst = pack_copy("lmdb")
    env = lmdb.open(str(dst / "data.lmdb"), subdir=True)
    with env.begin(write=True) as txn:
        val = bytearray(txn.get(b"%09d" % 5))
        val[-10] ^= 0x55
        txn.put(b"%09d" % 5, bytes(val))
    env.close()
    with pytest.raises(ShardError, match="record 5"):
        ShardDataset(dst, decode=None)[5]


def test_not_a_pack_and_wrong_reader(tmp_path, packs):
    with pytest.raises(ShardError, match="no manifest"):
        ShardDataset(tmp_path)
    with pytest.raises(PttError, match="ShardStream"):
        ShardDataset(packs["tar"])
    with pytest.raises(PttError, match="ShardDataset"):
        ShardStream(packs["lmdb"])


def test_inspect_reports_problems(pack_copy, packs):
    from pytorchtricks.shards.inspect import inspect_shards

    ok = inspect_shards(packs["tar"], decode=True)
    assert ok["problems"] == [] and ok["count"] == 48 and sum(ok["classes"].values()) == 48
    assert 0 < ok["overhead"] < 0.2
    dst = pack_copy("ptt")
    shard = _first_shard(dst)
    raw = bytearray(shard.read_bytes())
    raw[-7] ^= 1
    shard.write_bytes(bytes(raw))
    bad = inspect_shards(dst)
    assert any("sha256" in p for p in bad["problems"])


def _tar_declaring(path, size: int) -> None:
    """A one-member tar whose header declares ``size`` bytes (GNU base-256 size field), checksum fixed up."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("000000000.jpg")
        info.size = 4
        tf.addfile(info, io.BytesIO(b"\xff\xd8\xff\xe0"))
    raw = bytearray(buf.getvalue())
    raw[124:136] = b"\x80" + size.to_bytes(11, "big")  # base-256: what tarfile reads for sizes over 8 GiB
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    path.write_bytes(bytes(raw))


def test_a_tar_member_declaring_more_bytes_than_the_file_is_a_shard_error_before_any_allocation(tmp_path):
    # before: MemoryError (tarfile's read allocates the declared 2**62 bytes)
    from pytorchtricks.shards.tar_format import iter_tar_groups

    path = tmp_path / "shard-000000.tar"
    _tar_declaring(path, 2**62)
    with pytest.raises(ShardError, match="declares 4611686018427387904 bytes") as exc:
        list(iter_tar_groups(str(path)))
    assert str(path) in str(exc.value)
    _tar_declaring(path, 4)  # the same file with its true size reads
    assert [k for k, _ in iter_tar_groups(str(path))] == ["000000000"]
