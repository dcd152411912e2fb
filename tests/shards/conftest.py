"""Small real-photo sets for the shard tests, built once per session from the Debian wallpaper photos."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pytorchtricks.data.photoset import build_photo_set, wallpaper_sources


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 distinct JPEGs (3 classes) cropped from the installed wallpapers."""
    if not wallpaper_sources():
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    root = tmp_path_factory.mktemp("photos")
    build_photo_set(root, 48, seed=0, workers=1, max_sources=6)
    return root


@pytest.fixture(scope="session")
def photo_bytes(photos: Path) -> dict[bytes, int]:
    """Each photo's bytes -> its label (class index in sorted order)."""
    classes = sorted(p.name for p in photos.iterdir() if p.is_dir())
    out = {}
    for label, cls in enumerate(classes):
        for f in sorted((photos / cls).iterdir()):
            out[f.read_bytes()] = label
    return out


@pytest.fixture(scope="session")
def packs(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The photos packed once per format, in small shards (about 6 per pack)."""
    from pytorchtricks.shards.writer import pack

    base = tmp_path_factory.mktemp("packs")
    out = {}
    for fmt in ("ptt", "tar", "lmdb"):
        pack(photos, base / fmt, format=fmt, shard_size="600KB", workers=0)
        out[fmt] = base / fmt
    return out


@pytest.fixture
def truncated_src(photos: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """A copy of the photos' ``mate`` class plus ``mate/truncated.jpg`` (its first photo cut in half): (folder, the
    good files)."""
    src = tmp_path / "src"
    shutil.copytree(photos / "mate", src / "mate")
    good = sorted((src / "mate").iterdir())
    data = good[0].read_bytes()
    (src / "mate" / "truncated.jpg").write_bytes(data[: len(data) // 2])
    return src, good


@pytest.fixture
def pack_copy(packs: dict[str, Path], tmp_path: Path):
    """A writable copy of a session pack, for corruption tests."""

    def make(fmt: str) -> Path:
        dst = tmp_path / fmt
        shutil.copytree(packs[fmt], dst)
        for p in dst.rglob("*"):
            if p.is_file():
                os.chmod(p, 0o644)
        return dst

    return make


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on 127.0.0.1 (a real HTTP S3 API, as s3fs's own suite uses), with fake
    credentials and ``AWS_ENDPOINT_URL`` in the environment, so s3fs and subprocesses (torchrun) find it."""
    pytest.importorskip("s3fs", reason="s3fs is in the dev extra (make setup)")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is in the dev extra (make setup)")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_SESSION_TOKEN": "testing",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("AWS_PROFILE", raising=False)
        yield env
    server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket per test: ``(s3fs filesystem, bucket name)``."""
    import uuid

    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    name = f"b{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    return fs, name
