"""Packs on an S3 API (moto's standalone server on 127.0.0.1) through s3fs, and the node-shared cache."""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards import remote, upload
from pytorchtricks.shards.cache import NodeCache
from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.remote import scrub_url, with_retries
from pytorchtricks.shards.stream import ShardStream
from pytorchtricks.shards.writer import pack

N = 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, int]]:
    """40 distinct 24x24 noise PNGs in 2 classes; their bytes -> sample id."""
    root = tmp_path_factory.mktemp("tiny")
    ids = {}
    for i in range(N):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        path = root / f"c{i % 2}" / f"{i:02d}.png"
        pixels = np.random.default_rng(i).integers(0, 256, (24, 24, 3), dtype=np.uint8)  # ~1.8 KB as PNG
        Image.fromarray(pixels).save(path)
        ids[path.read_bytes()] = i
    return root, ids


@pytest.fixture(scope="module")
def local_packs(tiny, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tinypacks")
    out = {}
    for fmt in ("ptt", "tar"):
        pack(
            tiny[0], base / fmt, format=fmt, shard_size=8000 if fmt == "ptt" else 25000, workers=0
        )  # ~10 shards
        out[fmt] = base / fmt
    return out


@pytest.fixture
def bucket_packs(s3_bucket, local_packs) -> dict[str, str]:
    fs, name = s3_bucket
    for fmt, path in local_packs.items():
        fs.put(f"{path}/", f"{name}/{fmt}/", recursive=True)
    return {fmt: f"s3://{name}/{fmt}" for fmt in local_packs}


def _ids(items, ids: dict[bytes, int]) -> list[int]:
    return [ids[bytes(x)] for x, _, _ in items]


def _collate(batch):
    return batch


@pytest.mark.parametrize("fmt", ["ptt", "tar"])
def test_stream_from_s3_every_sample_once_and_one_download_per_shard_per_node(
    bucket_packs, tiny, tmp_path, fmt
):
    """2 ranks x 2 DataLoader workers on one node, interleaved (every reader touches every shard): every sample
    once, and each shard downloaded exactly once into the shared cache."""
    cache = tmp_path / "cache"
    seen = []
    for rank in range(2):
        s = ShardStream(bucket_packs[fmt], seed=3, decode=None, rank=rank, world_size=2, split="interleaved",
                        cache_dir=cache, batch_size=4, buffer_size=8)  # fmt: skip
        dl = torch.utils.data.DataLoader(s, batch_size=4, num_workers=2, collate_fn=_collate)
        seen += [tiny[1][bytes(x)] for b in dl for x, _, _ in b]
    assert sorted(seen) == list(range(N))
    stats = NodeCache(cache).stats()
    manifest = s._remote.manifest
    assert stats["downloads"] == len(manifest["shards"]) + (fmt == "ptt")  # + the index
    shard_bytes = sum(e["bytes"] for e in manifest["shards"])
    assert stats["downloaded_bytes"] >= shard_bytes and stats["hits"] > 0
    # a second epoch on the same node downloads nothing
    s.set_epoch(1)
    assert len(_ids(s, tiny[1])) == N // 2
    assert NodeCache(cache).stats()["downloads"] == stats["downloads"]


def test_dataset_and_loader_from_s3_with_a_cache_smaller_than_the_dataset(bucket_packs, tiny, tmp_path):
    """cache_limit holds 3 of the ~10 shards: two epochs read everything right, shards are evicted and fetched
    again, and the cache never held more than the limit."""
    cache = tmp_path / "cache"
    m = ShardStream(bucket_packs["ptt"], cache_dir=tmp_path / "probe")._remote.manifest
    largest = max(e["bytes"] for e in m["shards"])
    limit = 3 * largest + 40 * 33 + 4096  # three shards + the index (33 bytes a sample) + its header
    for epoch in range(2):
        s = ShardStream(bucket_packs["ptt"], seed=1, decode=None, cache_dir=cache, cache_limit=limit, prefetch=1,
                        buffer_size=4)  # fmt: skip
        s.set_epoch(epoch)
        assert sorted(_ids(s, tiny[1])) == list(range(N))
    stats = NodeCache(cache).stats()
    assert stats["evictions"] > 0 and stats["peak_bytes"] <= limit
    assert stats["downloads"] > len(m["shards"])  # what was evicted came back
    ds = ShardDataset(bucket_packs["ptt"], decode=None, cache_dir=cache, cache_limit=limit)
    assert sorted(tiny[1][bytes(ds[i][0])] for i in range(len(ds))) == list(range(N))
    assert NodeCache(cache).stats()["peak_bytes"] <= limit


def test_a_corrupt_shard_in_the_bucket_is_fetched_twice_then_named(s3_bucket, bucket_packs, tmp_path):
    fs, name = s3_bucket
    key = f"{name}/ptt/shard-000002.ptt"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte: only the sha256 can tell
    fs.pipe_file(key, bytes(data))
    cache = tmp_path / "cache"
    s = ShardStream(bucket_packs["ptt"], decode=None, cache_dir=cache, shuffle=False)
    with pytest.raises(ShardError, match=r"shard-000002\.ptt.*s3://.*sha256 differs") as err:
        list(s)
    assert "testing-secret" not in str(err.value)
    assert not any(p.name.startswith("shard-000002") for p in cache.rglob("*"))  # nothing corrupt stays
    before = NodeCache(cache).stats()
    assert before["downloads"] >= 2


def test_pack_to_s3_is_the_local_pack_and_an_interrupted_upload_resumes(
    s3_bucket, tiny, local_packs, tmp_path, monkeypatch
):
    fs, name = s3_bucket
    url = f"s3://{name}/packed"
    real, calls = upload._put, [0]

    def flaky(*a, **k):
        calls[0] += 1
        if calls[0] == 4:
            raise ShardError("upload failed (simulated)", path="x")
        return real(*a, **k)

    monkeypatch.setattr(upload, "_put", flaky)
    staging = tmp_path / "staging"
    with pytest.raises(ShardError, match="simulated"):
        pack(tiny[0], url, shard_size=8000, workers=0, staging_dir=staging)
    assert not fs.exists(f"{name}/packed/manifest.json")  # readers never see an incomplete pack
    monkeypatch.setattr(upload, "_put", real)
    stats = upload.upload_pack(str(staging), url)
    assert stats["skipped"] == 3  # what went up before the failure is not sent again
    for f in sorted(os.listdir(local_packs["ptt"])):
        assert fs.cat_file(f"{name}/packed/{f}") == (local_packs["ptt"] / f).read_bytes(), f
    with pytest.warns(UserWarning, match="already holds this pack"):
        pack(tiny[0], url, shard_size=8000, workers=0, staging_dir=staging)


def test_inspect_and_doctor_data_read_urls(bucket_packs, tmp_path, capsys):
    from pytorchtricks.cli import main

    assert main(["inspect", bucket_packs["ptt"], "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "40 samples" in out and bucket_packs["ptt"] in out
    from pytorchtricks.shards.inspect import inspect_shards

    r = inspect_shards(bucket_packs["tar"], cache_dir=tmp_path / "c", cache_limit="1MB")
    assert r["problems"] == [] and r["count"] == N
    from pytorchtricks.analysis.data_doctor import doctor_data

    rep = doctor_data(bucket_packs["ptt"], batch_size=4, crop=16, batches=2, num_workers=0, step_time_s=0.0,
                      cache_dir=tmp_path / "c")  # fmt: skip
    assert rep.batch_size == 4


def test_errors_name_the_url_without_credentials(s3_server, tmp_path):
    with pytest.raises(ShardError, match="not found") as err:
        ShardStream("s3://no-such-bucket-here/p", cache_dir=tmp_path)
    assert "s3://no-such-bucket-here/p/manifest.json" in str(err.value)
    assert (
        scrub_url("https://ak:sk@h/p?sig=1&X-Amz-Credential=k") == "https://h/p?sig=***&X-Amz-Credential=***"
    )
    with pytest.raises(PttError, match="unsupported URL scheme"):
        ShardStream("ftp://h/p")
    with pytest.raises(PttError, match="read-only"):
        pack(tmp_path, "https://example.invalid/p")


def test_transient_errors_are_retried_with_backoff(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.001)
    calls = collections.Counter()

    def flaky():
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert with_retries(flaky, "read", "s3://b/k") == "ok" and calls["n"] == 3
    calls.clear()
    with pytest.raises(ShardError, match="after 4 attempt"):
        with_retries(
            lambda: (calls.update(n=1), (_ for _ in ()).throw(TimeoutError("slow")))[1], "read", "s3://b/k"
        )
    assert calls["n"] == 4
    calls.clear()
    with pytest.raises(ShardError, match="not found"):  # permanent: no retry
        with_retries(
            lambda: (calls.update(n=1), (_ for _ in ()).throw(FileNotFoundError("k")))[1], "read", "s3://b/k"
        )
    assert calls["n"] == 1


def test_one_download_per_shard_when_many_threads_ask_at_once(tmp_path, run_threads):
    """The download lock: 8 readers asking for the same file at once fetch it once."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(200_000))
    cache = NodeCache(tmp_path / "cache")
    pins = []
    errors = run_threads(lambda: pins.append(cache.acquire("p/shard-000000.ptt", f"file://{src}")), 8)
    assert not errors and len(pins) == 8
    assert cache.stats()["downloads"] == 1 and cache.stats()["hits"] == 7
    assert Path(pins[0].path).read_bytes() == src.read_bytes()
    for p in pins:
        p.release()


@pytest.mark.parametrize("fmt", ["ptt", "tar"])
def test_make_loader_takes_a_pack_url(bucket_packs, tmp_path, fmt):
    from pytorchtricks.tricks.data.make_loader import make_loader

    loader = make_loader(bucket_packs[fmt], 8, crop=None, flip=False, num_workers=0, drop_last=False,
                         cache_dir=tmp_path / "c")  # fmt: skip
    shapes = [tuple(x.shape) for x, _ in loader]
    assert sum(s[0] for s in shapes) == N and {s[1:] for s in shapes} == {(3, 24, 24)}


def test_lru_eviction_keeps_the_recently_used_and_never_a_pinned_shard(tmp_path):
    """limit = 2 shards: a third evicts the least recently used one that no reader pins."""
    src = tmp_path / "src"
    src.mkdir()
    for name in "abcd":
        (src / f"shard-{name}.ptt").write_bytes(name.encode() * 1000)
    cache = NodeCache(tmp_path / "cache", limit=2000)
    pause = threading.Event()

    def get(name: str):
        pin = cache.acquire(f"p/shard-{name}.ptt", f"file://{src}/shard-{name}.ptt", size=1000)
        pause.wait(0.03)  # file times are coarse (a few ms): keep the order visible
        return pin

    get("a").release()
    pinned_b = get("b")  # a reader keeps b open
    get("a").release()  # a is now the most recently used
    get("c").release()  # over the limit: b is older but pinned, so a goes
    held = {p.name for p in (tmp_path / "cache" / "p").iterdir()}
    assert held == {"shard-b.ptt", "shard-c.ptt"}
    pinned_b.release()
    get("d").release()  # b is free now and the least recently used
    assert {p.name for p in (tmp_path / "cache" / "p").iterdir()} == {"shard-c.ptt", "shard-d.ptt"}
    assert cache.stats()["evictions"] == 2 and cache.stats()["peak_bytes"] <= 2000


def test_a_pack_served_over_plain_http(local_packs, tiny, tmp_path):
    """http(s):// through fsspec's HTTP filesystem: Python's own file server (no Range support) on 127.0.0.1."""
    import functools
    import http.server
    import socketserver

    pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (remote extra)")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(local_packs["ptt"].parent))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as srv:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{srv.server_address[1]}/{local_packs['ptt'].name}"
            s = ShardStream(url, seed=0, decode=None, cache_dir=tmp_path / "c")
            assert sorted(_ids(s, tiny[1])) == list(range(N))
            assert _inspect_problems(url, tmp_path / "c2") == []
        finally:
            srv.shutdown()


def _inspect_problems(url: str, cache: Path) -> list[str]:
    from pytorchtricks.shards.inspect import inspect_shards

    return inspect_shards(url, cache_dir=cache)["problems"]
