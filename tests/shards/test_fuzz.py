"""Fuzz the ptt and tar readers: random truncation and bit flips give only ShardError, never a crash or a hang."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards.ptt_format import MappedShard, read_ptt_table, write_ptt_shard
from pytorchtricks.shards.record import decode_record, encode_record
from pytorchtricks.shards.tar_format import iter_tar_groups, tar_sample, tar_sample_members, write_tar_shard

_FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _records(n: int = 6) -> tuple[list[bytes], list[int]]:
    rng = np.random.default_rng(0)
    recs, labels = [], []
    for i in range(n):
        payload = rng.integers(0, 256, int(rng.integers(1, 900)), dtype=np.uint8).tobytes()
        recs.append(encode_record(payload, label=i % 3, kind="jpeg", extras={"i": i} if i % 2 else {}))
        labels.append(i % 3)
    return recs, labels


@pytest.fixture(scope="module")
def ptt_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fz") / "s.ptt"
    recs, labels = _records()
    write_ptt_shard(str(path), recs, labels, {"src_start": 0})
    return path.read_bytes()


@pytest.fixture(scope="module")
def tar_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fz") / "s.tar"
    recs, labels = _records()
    members = [
        m for i, r in enumerate(recs) for m in tar_sample_members(f"{i:04d}", r, "jpeg", labels[i], {})
    ]
    write_tar_shard(str(path), members)
    return path.read_bytes()


def _read_all_ptt(path: str) -> int:
    _, offsets, crcs, _ = read_ptt_table(path)
    mm = MappedShard(path)
    n = 0
    for i in range(len(crcs)):
        rec = mm.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i]), i)
        decode_record(rec, path=path, index=i, crc=int(crcs[i]))
        n += 1
    return n


def _read_all_tar(path: str) -> int:
    n = 0
    for j, (key, group) in enumerate(iter_tar_groups(path)):
        tar_sample(key, group, path=path, index=j)
        n += 1
    return n


def _mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    b = bytearray(data[: max(0, len(data) - cut)])
    for pos, bit in flips:
        if b:
            b[pos % len(b)] ^= 1 << bit
    return bytes(b)


mutations = st.tuples(
    st.integers(0, 4000),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 7)), max_size=4),
)


@_FUZZ
@given(m=mutations)
def test_ptt_reader_fuzz(ptt_bytes, tmp_path, m):
    path = tmp_path / "f.ptt"
    mutated = _mutate(ptt_bytes, *m)
    path.write_bytes(mutated)
    try:
        n = _read_all_ptt(str(path))
    except ShardError:
        return
    assert n == 6 or mutated != ptt_bytes  # a mutation that slips through must leave every CRC valid


@_FUZZ
@given(m=mutations)
def test_tar_reader_fuzz(tar_bytes, tmp_path, m):
    path = tmp_path / "f.tar"
    path.write_bytes(_mutate(tar_bytes, *m))
    try:
        _read_all_tar(str(path))
    except ShardError:
        pass


@_FUZZ
@given(data=st.binary(max_size=3000))
def test_readers_on_random_bytes(tmp_path, data):
    for name, read in (("r.ptt", _read_all_ptt), ("r.tar", _read_all_tar)):
        path = tmp_path / name
        path.write_bytes(data)
        try:
            read(str(path))
        except ShardError:
            pass


def test_intact_files_read_fully(ptt_bytes, tar_bytes, tmp_path):
    (tmp_path / "a.ptt").write_bytes(ptt_bytes)
    (tmp_path / "a.tar").write_bytes(tar_bytes)
    assert _read_all_ptt(str(tmp_path / "a.ptt")) == 6
    assert _read_all_tar(str(tmp_path / "a.tar")) == 6


def test_tar_member_with_dotdot_is_never_written(tmp_path):
    """A hostile member path is only a key: reading writes nothing anywhere."""
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("../../escape.jpg", b"\xff\xd8\xffdata"), ("../../escape.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    work = tmp_path / "deep" / "work"
    work.mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    groups = list(iter_tar_groups(str(path)))
    assert [k for k, _ in groups] == ["../../escape"]
    _payload, label, extras = tar_sample(*groups[0], path=str(path), index=0)
    assert label == 1 and extras["__key__"] == "../../escape"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not (tmp_path.parent / "escape.jpg").exists()
