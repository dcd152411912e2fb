"""Put a finished local pack into object storage: one atomic upload per object, the manifest last, resumable.

Readers treat ``manifest.json`` as "the pack is complete" (``layout``), so it is uploaded after every shard and
the index. Each object is one PUT (a multipart upload too only becomes visible when it completes), so a reader
never sees half an object. ``.upload-journal.json`` in the local pack lists what went up with its sha256; a re-run
skips an object when the journal's sha256 is the local file's and the stored object has its size.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards import layout
from pytorchtricks.shards.remote import fetch_bytes, filesystem, join_url, scrub_url, with_retries

JOURNAL = ".upload-journal.json"
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory")


def check_destination(url: str) -> None:
    scheme = url.split("://", 1)[0].lower()
    if scheme not in OBJECT_STORES:
        raise PttError(
            f"cannot pack to {scrub_url(url)}: {scheme}:// is read-only here; pack to s3://, gs://, az:// or a "
            "local folder (then serve or copy that folder)."
        )


def remote_manifest(url: str) -> dict[str, Any] | None:
    """The manifest at ``url``/manifest.json when there is one (a complete pack), else None."""
    where = join_url(url, layout.MANIFEST)
    fs, rpath = filesystem(where)
    fs.invalidate_cache()  # a listing cached by an earlier call may predate the upload
    if not with_retries(lambda: fs.exists(rpath), "stat", where):
        return None
    try:
        return layout.check_manifest(json.loads(fetch_bytes(where)), scrub_url(where))
    except ValueError as exc:
        raise ShardError(f"unreadable manifest: {exc}", path=scrub_url(where)) from exc


def _remote_size(fs: Any, rpath: str, url: str) -> int:
    return int(with_retries(lambda: fs.info(rpath)["size"], "stat", url))


def _put(fs: Any, path: str, rpath: str, url: str) -> None:
    with_retries(lambda: fs.put_file(path, rpath), "upload", url)


def upload_pack(local: str, url: str) -> dict[str, int]:
    """Upload the complete pack folder ``local`` to ``url``; returns ``{"uploaded", "skipped", "bytes"}``."""
    check_destination(url)
    manifest = layout.load_manifest(local)
    names = [s["name"] for s in manifest["shards"]]
    if manifest["format"] == "lmdb":
        raise PttError(
            "an LMDB pack is one database that cannot be read in parts: pack with --format ptt or tar."
        )
    if os.path.exists(os.path.join(local, layout.INDEX)):
        names.append(layout.INDEX)
    jpath = os.path.join(local, JOURNAL)
    try:
        with open(jpath, encoding="utf-8") as fh:
            done: dict[str, str] = json.load(fh)
    except (OSError, ValueError):
        done = {}
    fs, base = filesystem(url)
    stats = {"uploaded": 0, "skipped": 0, "bytes": 0}
    for name in [*names, layout.MANIFEST]:
        path = os.path.join(local, name)
        digest = layout.file_sha256(path)
        target = join_url(url, name)
        rpath = base.rstrip("/") + "/" + name
        if done.get(name) == digest and name != layout.MANIFEST:
            try:
                size = _remote_size(fs, rpath, target)
            except ShardError:
                size = None
            if size == os.path.getsize(path):
                stats["skipped"] += 1
                continue
        _put(fs, path, rpath, target)
        stats["uploaded"] += 1
        stats["bytes"] += os.path.getsize(path)
        done[name] = digest
        tmp = f"{jpath}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(done, fh)
        os.replace(tmp, jpath)
    return stats
