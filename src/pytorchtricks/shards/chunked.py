"""A chunk-aligned pack in which every process writes its own chunks' shards: ``ptt pack --distributed``.

Layout. The (permuted) listing is cut into chunks of ``chunk_items(n)`` files, a function of ``n`` alone. The
samples of chunk ``c`` that pass fill, in order, the shards ``shard-<c:06d>-<p:03d>.<fmt>``, each closed before it
would pass ``shard_size``; a shard never spans two chunks. So every shard is a function of the input, the options
and the seed, never of the world size: a pack made at world size 4 is byte for byte the one made at 1, 2 or 3.
Sample keys (tar member names; a ptt shard's ``first_sample``) are ``c * chunk_items(n) + j`` for the ``j``-th
sample kept in chunk ``c``: increasing and consecutive within a shard (the manifest lists each shard's
``first_key``), with a gap after a chunk that rejected files. Not the same bytes as ``ptt pack`` in one process:
there a shard closes only at ``shard_size``, here also at each chunk's end; readers see the same samples in the
same order either way.

Work. Rank ``r`` of ``world`` owns the chunks ``c % world == r`` and writes each of them: its shards (a temp file
renamed, or, for a bucket, one shard staged locally, PUT, deleted: never the whole pack on local disk), then its
record in ``.pack-chunks-<digest>/``: ``chunk-<c>.npy`` (its index rows) and ``chunk-<c>.json`` (its shards with
size and sha256, rejects, class counts), the JSON last, so a chunk whose JSON exists is complete. After a barrier
rank 0 reads only the records (the index's 32 bytes per sample and a few lines per chunk), writes ``index.npy`` and
then ``manifest.json`` (last: its presence means complete), and removes the records and whatever a killed run left
(temp files, shards no record lists). A re-run of the same command, at any world size, skips complete chunks.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import ShardError
from pytorchtricks.data.sources import Source, process_item
from pytorchtricks.shards import layout
from pytorchtricks.shards._pool import ordered_map
from pytorchtricks.shards.ptt_format import read_ptt_table, write_ptt_shard
from pytorchtricks.shards.record import encode_record
from pytorchtricks.shards.remote import filesystem, is_url, join_url, scrub_url, with_retries
from pytorchtricks.shards.tar_format import tar_sample_members, write_tar_shard

RECORDS = ".pack-chunks-"  # + the pack digest's first 16 hex digits: the folder of chunk records


class Plan(Protocol):
    """What the work needs from ``writer.pack``'s checked plan."""

    @property
    def source(self) -> Source: ...
    @property
    def opts(self) -> dict[str, Any]: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def digest(self) -> str: ...
    @property
    def limit(self) -> int: ...
    @property
    def strict(self) -> bool: ...
    @property
    def verify(self) -> bool: ...

    def jobs(self, order: np.ndarray, lo: int, hi: int) -> list[tuple[int, str, dict[str, Any]]]: ...

    def n_workers(self) -> int: ...


def chunk_items(n: int) -> int:
    """Files per chunk for a listing of ``n`` files: a function of ``n`` only, so a re-run at another world size
    finds the same chunks (8 to 4096 files; at most about 4096 chunks).

    Example:
        >>> chunk_items(100), chunk_items(10_000_000)
        (8, 2442)
    """
    return max(8, min(4096, -(-n // 4096)))


def shard_name(fmt: str, chunk: int, part: int) -> str:
    return f"shard-{chunk:06d}-{part:03d}.{fmt}"


class Target:
    """The pack's folder: a local path (files renamed into place) or a bucket URL (one PUT per object, each
    staged alone in ``staging``). Names are relative to the pack (``a/b`` for the records folder)."""

    def __init__(self, dst: str, staging: str) -> None:
        self.dst, self.staging, self.remote = dst, staging, is_url(dst)
        os.makedirs(staging if self.remote else dst, exist_ok=True)

    def local_path(self, name: str) -> str:
        """Where to write ``name`` before ``commit``: its final path (local) or a staging file (bucket)."""
        path = os.path.join(self.staging if self.remote else self.dst, name.replace("/", os.sep))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def commit(self, name: str) -> None:
        """Publish ``local_path(name)``, written completely: a no-op locally (renamed already), a PUT to a bucket."""
        if self.remote:
            path, url = self.local_path(name), join_url(self.dst, name)
            fs, rpath = filesystem(url)
            with_retries(lambda: fs.put_file(path, rpath), "upload", url)  # one PUT: all or nothing
            os.remove(path)

    def write_bytes(self, name: str, data: bytes) -> None:
        path = self.local_path(name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        self.commit(name)

    def read_bytes(self, name: str) -> bytes | None:
        if not self.remote:
            try:
                with open(os.path.join(self.dst, name), "rb") as fh:
                    return fh.read()
            except FileNotFoundError:
                return None
        url = join_url(self.dst, name)
        fs, rpath = filesystem(url)
        fs.invalidate_cache()
        if not with_retries(lambda: fs.exists(rpath), "stat", url):
            return None
        return bytes(with_retries(lambda: fs.cat_file(rpath), "read", url))

    def size(self, name: str) -> int | None:
        if not self.remote:
            try:
                return os.stat(os.path.join(self.dst, name)).st_size
            except FileNotFoundError:
                return None
        url = join_url(self.dst, name)
        fs, rpath = filesystem(url)
        if not with_retries(lambda: fs.exists(rpath), "stat", url):
            return None
        return int(with_retries(lambda: fs.info(rpath)["size"], "stat", url))

    def names(self) -> list[str]:
        """The top-level names in the pack folder."""
        if not self.remote:
            return os.listdir(self.dst) if os.path.isdir(self.dst) else []
        fs, rpath = filesystem(self.dst)
        fs.invalidate_cache()
        if not with_retries(lambda: fs.exists(rpath), "stat", self.dst):
            return []
        found = with_retries(lambda: fs.ls(rpath, detail=False), "list", self.dst)
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in found]

    def manifest(self) -> dict[str, Any] | None:
        """The manifest of a complete pack here, else None."""
        raw = self.read_bytes(layout.MANIFEST)
        if raw is None:
            return None
        where = scrub_url(self.dst) if self.remote else self.dst
        try:
            return layout.check_manifest(json.loads(raw), where)
        except ValueError as exc:
            raise ShardError(f"unreadable manifest: {exc}", path=where) from exc

    def remove(self, name: str) -> None:
        if not self.remote:
            path = os.path.join(self.dst, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            return
        url = join_url(self.dst, name)
        fs, rpath = filesystem(url)
        if with_retries(lambda: fs.exists(rpath), "stat", url):
            with_retries(lambda: fs.rm(rpath, recursive=True), "delete", url)


def records_dir(digest: str) -> str:
    return RECORDS + digest[:16]


def _record_names(digest: str, c: int) -> tuple[str, str]:
    base = f"{records_dir(digest)}/chunk-{c:06d}"
    return base + ".json", base + ".npy"


def _complete(target: Target, digest: str, c: int) -> dict[str, Any] | None:
    """Chunk ``c``'s record when it is complete: its JSON parses, is of this pack, and every shard it lists is
    there at its listed size (a shard's sha256 is checked by ``--verify`` and by readers, not on every re-run)."""
    raw = target.read_bytes(_record_names(digest, c)[0])
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("digest") != digest or rec.get("chunk") != c:
        return None
    if any(target.size(s["name"]) != s["bytes"] for s in rec.get("shards", [])):
        return None
    return rec


class _Chunk:
    """Chunk ``c`` being written: its current shard's samples, the closed shards, rejects and counts."""

    def __init__(self, plan: Plan, target: Target, c: int, size: int, lo: int) -> None:
        self.plan, self.target, self.c, self.fmt = plan, target, c, plan.opts["format"]
        self.key0 = (
            c * size
        )  # sample keys of this chunk start here: a function of the chunk, not of the world
        self.items: list[tuple[bytes, int, list[tuple[str, bytes]] | None]] = []
        self.bytes, self.kept, self.src_start = 0, 0, lo
        self.shards: list[dict[str, Any]] = []
        self.rows: list[np.ndarray] = []
        self.rejects: list[dict[str, str]] = []
        self.shard_rejects: list[dict[str, str]] = []
        self.labels: list[int] = []
        self.payload_bytes = self.bytes_in = 0

    def add(self, k: int, res: tuple[Any, ...]) -> None:
        """Result ``res`` of ``process_item`` for position ``k`` of the permuted listing (as ``writer._Run.add``)."""
        i, kind, payload, info, nbytes = res
        source = self.plan.source
        self.bytes_in += nbytes
        if kind == "reject":
            if self.plan.strict:
                raise PttError(f"{source.rel[i]}: {info} (drop --strict to skip bad files and list them)")
            self.rejects.append({"path": source.rel[i], "reason": str(info)})
            self.shard_rejects.append(self.rejects[-1])
            return
        label, extras = source.labels[i], source.extras[i]
        if "target" in extras or "boxes" in extras:  # boxes live in pixels: they follow a pack-time resize
            from pytorchtricks.shards.targets import boxes_follow

            try:
                extras = boxes_follow(
                    extras, payload, kind, info, source.paths[i],
                    (self.plan.opts.get("resize"), self.plan.opts.get("max_side")),
                )  # fmt: skip
            except ValueError as exc:
                if self.plan.strict:
                    raise PttError(f"{source.rel[i]}: {exc} (drop --strict to list it in rejects)") from exc
                self.rejects.append({"path": source.rel[i], "reason": str(exc)})
                self.shard_rejects.append(self.rejects[-1])
                return
        key = f"{self.key0 + self.kept + len(self.items):09d}"
        if self.fmt == "tar":
            members = tar_sample_members(key, payload, kind, label, extras)
            size, rec = sum(512 + (len(d) + 511) // 512 * 512 for _, d in members), b""
        else:
            rec = encode_record(payload, label=label, kind=kind, extras=extras, shape=info)
            members, size = None, len(rec)
        if self.items and self.bytes + size > self.plan.limit:
            self._flush(k)
        self.items.append((rec, label, members))
        self.labels.append(label)
        self.bytes += size
        self.payload_bytes += len(payload)

    def _flush(self, src_end: int) -> None:
        name = shard_name(self.fmt, self.c, len(self.shards))
        path = self.target.local_path(name)
        first = self.key0 + self.kept
        labels = [lab for _, lab, _ in self.items]
        if self.fmt == "ptt":
            header = {
                "src_start": self.src_start,
                "src_end": src_end,
                "first_sample": first,
                "rejects": self.shard_rejects,
            }
            write_ptt_shard(path, [r for r, _, _ in self.items], labels, header)
            _, offsets, crcs, _ = read_ptt_table(path)  # the table just written: a few bytes per record
            rows = np.zeros(len(labels), dtype=layout.INDEX_DTYPE)
            rows["shard"], rows["offset"], rows["length"] = len(self.shards), offsets[:-1], np.diff(offsets)
            rows["label"], rows["crc"] = labels, crcs
            self.rows.append(rows)
        else:
            write_tar_shard(path, [m for _, _, ms in self.items for m in (ms or [])])
        entry = {
            "name": name,
            "count": len(self.items),
            "bytes": os.path.getsize(path),
            "sha256": layout.file_sha256(path),
            "first_key": first,
        }
        self.target.commit(name)
        self.shards.append(entry)
        self.kept += len(self.items)
        self.items, self.bytes, self.shard_rejects, self.src_start = [], 0, [], src_end

    def finish(self, src_end: int, n_classes: int) -> dict[str, Any]:
        """Close the last shard, then write the record: the index rows, then the JSON that marks it complete."""
        if self.items:
            self._flush(src_end)
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, dtype=layout.INDEX_DTYPE)
        buf = io.BytesIO()
        np.save(buf, rows, allow_pickle=False)
        json_name, npy_name = _record_names(self.plan.digest, self.c)
        self.target.write_bytes(npy_name, buf.getvalue())
        rec = {
            "digest": self.plan.digest,
            "chunk": self.c,
            "shards": self.shards,
            "rejects": self.rejects,
            "class_counts": np.bincount(self.labels, minlength=n_classes).tolist() if self.labels else [],
            "payload_bytes": self.payload_bytes,
            "bytes_in": self.bytes_in,
            "rows_sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
        }
        self.target.write_bytes(json_name, json.dumps(rec, sort_keys=True).encode())
        return rec


def write_chunks(
    plan: Plan, order: np.ndarray, target: Target, rank: int, world: int, died: Any
) -> dict[str, int]:
    """Write every incomplete chunk ``c`` with ``c % world == rank``; returns what this process did.

    One worker pool for all of them (``ordered_map``), its results split at the chunk boundaries.
    """
    n = len(order)
    size = chunk_items(n)
    mine = [c for c in range(rank, -(-n // size), world)]
    todo = [c for c in mine if _complete(target, plan.digest, c) is None]
    stats = {"chunks": len(todo), "chunks_skipped": len(mine) - len(todo), "files": 0, "shard_bytes": 0}
    jobs = [job for c in todo for job in plan.jobs(order, c * size, min(n, (c + 1) * size))]
    results: Iterator[tuple[Any, ...]] = ordered_map(process_item, jobs, plan.n_workers(), died)
    try:
        for c in todo:
            lo, hi = c * size, min(n, (c + 1) * size)
            chunk = _Chunk(plan, target, c, size, lo)
            for k in range(lo, hi):
                chunk.add(k, next(results))
            rec = chunk.finish(hi, len(plan.source.classes))
            stats["files"] += hi - lo
            stats["shard_bytes"] += sum(s["bytes"] for s in rec["shards"])
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # on an error: stop the pool now, not at garbage collection
    return stats


def merge_chunks(plan: Plan, n: int, target: Target) -> dict[str, Any]:
    """Rank 0's part: the records into ``index.npy`` and ``manifest.json`` (last), then the clean-up.

    Raises:
        PttError: a chunk has no complete record (a rank failed before it finished: re-run the command).
    """
    size, digest, fmt = chunk_items(n), plan.digest, plan.opts["format"]
    records: list[dict[str, Any]] = []
    rows: list[np.ndarray] = []
    n_shards = 0
    for c in range(-(-n // size)):
        rec = _complete(target, digest, c)
        raw = target.read_bytes(_record_names(digest, c)[1]) if rec is not None else None
        if rec is None or raw is None or hashlib.sha256(raw).hexdigest() != rec["rows_sha256"]:
            raise PttError(
                f"chunk {c} of {scrub_url(target.dst)} has no complete record: a rank stopped before writing it. "
                "Run the same command again: complete chunks are kept."
            )
        part = np.load(io.BytesIO(raw), allow_pickle=False)
        part["shard"] += n_shards  # chunk-local shard numbers -> the pack's
        n_shards += len(rec["shards"])
        records.append(rec)
        rows.append(part)
    source = plan.source
    shards = [s for r in records for s in r["shards"]]
    class_counts = np.zeros(len(source.classes), dtype=np.int64)
    for r in records:
        if r["class_counts"]:
            class_counts += np.asarray(r["class_counts"], dtype=np.int64)
    manifest: dict[str, Any] = {
        "format": fmt,
        "version": layout.VERSION,
        "digest": digest,
        "count": sum(s["count"] for s in shards),
        "classes": source.classes,
        "class_counts": class_counts.tolist(),
        "options": plan.options,
        "shards": shards,
        "rejects": [*source.skipped, *(x for r in records for x in r["rejects"])],
        "files_in": n,
        "bytes_in": sum(r["bytes_in"] for r in records),
        "payload_bytes": sum(r["payload_bytes"] for r in records),
        "bytes_out": sum(s["bytes"] for s in shards),
        "chunk_items": size,
    }
    if source.detection is not None:  # the boxes per image and class, the image sizes (``ptt inspect``)
        from pytorchtricks.shards.targets import manifest_summary

        manifest["detection"] = manifest_summary(source, manifest["rejects"], plan.options)
    if fmt == "ptt":
        index = np.concatenate(rows) if rows else np.zeros(0, dtype=layout.INDEX_DTYPE)
        buf = io.BytesIO()
        np.save(buf, index, allow_pickle=False)
        target.write_bytes(layout.INDEX, buf.getvalue())
        if "detection" in manifest and not target.remote:  # every target in one file (a bucket's pack: none)
            from pytorchtricks.shards.targets import write_targets

            manifest["detection"]["targets"] = write_targets(target.dst, index, shards)
    if plan.verify and not target.remote:
        from pytorchtricks.shards.inspect import verify_shards

        problems = verify_shards(target.dst, manifest)
        if problems:
            raise ShardError("; ".join(problems[:5]), path=target.dst)
    target.write_bytes(layout.MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    clean(target, manifest)
    return manifest


def clean(target: Target, manifest: dict[str, Any]) -> None:
    """Remove what a complete chunked pack does not list: chunk records, temp files, other shards."""
    keep = {s["name"] for s in manifest["shards"]}
    for name in target.names():
        stale = (
            name.startswith(RECORDS)
            or (".tmp" in name and layout.is_pack_file(name))
            or (name.startswith("shard-") and layout.is_pack_file(name) and name not in keep)
            or (name == layout.INDEX and manifest["format"] != "ptt")
            or (name == layout.TARGETS and "targets" not in (manifest.get("detection") or {}))
        )
        if stale:
            target.remove(name)
    if target.remote:
        shutil.rmtree(target.staging, ignore_errors=True)
