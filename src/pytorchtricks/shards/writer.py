"""``pack``: turn a folder or list of images into ptt, tar or lmdb shards - parallel, deterministic, resumable.

Order of work: list the source (sorted; optionally permuted with a fixed seed), process files in worker processes
(``sources.process_item``), append results in input order to the current shard, and close a shard when the next
record would pass ``shard_size``. Each closed shard is written to a temp file and renamed, then the journal
(``.pack-journal.json``) is replaced atomically. A re-run with the same options reads the journal, checks each
listed shard's sha256, and continues after the last good one: the result is byte-identical to an uninterrupted
pack. The manifest (``manifest.json``) is written last; its presence means the pack is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.shards import layout
from pytorchtricks.shards.lmdb_format import LmdbWriter
from pytorchtricks.shards.ptt_format import write_ptt_shard
from pytorchtricks.shards.record import encode_record
from pytorchtricks.shards.sources import Source, list_source, process_item
from pytorchtricks.shards.tar_format import tar_sample_members, write_tar_shard

FORMATS = ("ptt", "tar", "lmdb")
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "K": 1024,  # a bare K/M/G is binary, as in `docker --memory 1.5g` and GPU cards' "24G"
    "M": 1024**2,
    "G": 1024**3,
}


def parse_bytes(text: str | int) -> int:
    """``"64MB"`` -> 64000000, ``"1MiB"`` -> 1048576, ``"1.5G"`` -> 1.5 GiB (a bare K/M/G is binary), ``4096``.

    Example:
        >>> parse_bytes("64MB"), parse_bytes("1MiB"), parse_bytes(10), parse_bytes("1.5G") == 3 * 2**29
        (64000000, 1048576, 10, True)
    """
    if isinstance(text, int):
        return text
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    try:
        return int(float(num) * _UNITS[unit])
    except (KeyError, ValueError) as exc:
        raise PttError(f"cannot read size {text!r}; write e.g. 64MB, 512KiB, 1.5G or 24GiB.") from exc


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def _order(n: int, shuffle: bool, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)


class _Journal:
    """Completed shards so far; replaced atomically after each shard."""

    def __init__(self, dst: str, digest: str) -> None:
        self.path = os.path.join(dst, layout.JOURNAL)
        self.digest = digest
        self.shards: list[dict[str, Any]] = []

    def load(self, fmt: str, dst: str) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as fh:
            state = json.load(fh)
        if state.get("digest") != self.digest:
            return  # different input or options: start over
        for s in state.get("shards", []):
            p = os.path.join(dst, s["name"] or "")
            if fmt != "lmdb" and s["name"] and (not os.path.exists(p) or _sha256(p) != s["sha256"]):
                break  # keep only the verified prefix
            self.shards.append(s)

    def save(self) -> None:
        _write_json_atomic(self.path, {"digest": self.digest, "shards": self.shards})


def _results(jobs: list[tuple[int, str, dict[str, Any]]], workers: int) -> Iterator[tuple[Any, ...]]:
    if workers <= 1 or len(jobs) < 2:
        yield from map(process_item, jobs)
        return
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(process_item, jobs, chunksize=8)


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str = "ptt",
    resize: int | None = None,
    max_side: int | None = None,
    quality: int | None = None,
    raw: bool = False,
    shard_size: int | str = "64MB",
    workers: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    strict: bool = False,
    verify: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Pack ``src`` (ImageFolder tree or .csv/.jsonl list) into ``dst``; returns the summary (also the manifest).

    Args:
        format: ``ptt`` (indexed, random access), ``tar`` (WebDataset) or ``lmdb``.
        resize / max_side: shrink so the short side / long side is at most this (area interpolation), once.
        quality: re-encode JPEG at this quality (default 90 when resizing). raw: store decoded uint8 HWC.
        shard_size: bytes per shard (``"64MB"``). workers: processes (default: all cores; 0/1: in-process).
        shuffle, seed: store samples in a fixed-seed permuted order (better mixing for streaming readers).
        strict: fail on the first bad file instead of listing it in ``rejects``. verify: re-read every shard.
        progress: show a rich progress bar.

    Worker processes are started with ``spawn``: a script that calls ``pack`` with workers > 1 needs the usual
    ``if __name__ == "__main__":`` guard.

    Example:
        >>> import tempfile, os, io; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/cat")
        >>> Image.new("RGB", (32, 24)).save(f"{src}/cat/a.jpg")
        >>> ptt.pack(src, tempfile.mkdtemp() + "/out", workers=0)["count"]
        1
    """
    if format not in FORMATS:
        raise PttError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}.")
    if raw and quality is not None:
        raise PttError("--raw stores decoded pixels; drop --quality (it applies to re-encoded JPEG only).")
    for name, v in (("resize", resize), ("max_side", max_side)):
        if v is not None and v < 1:
            raise PttError(f"{name} must be a positive number of pixels, got {v}.")
    if quality is not None and not 1 <= quality <= 100:
        raise PttError(f"quality must be in 1..100, got {quality}.")
    limit = parse_bytes(shard_size)
    if limit < 1:
        raise PttError("shard_size must be positive, e.g. 64MB.")
    source = list_source(src)
    dst = os.fspath(dst)
    opts = {"format": format, "resize": resize, "max_side": max_side, "quality": quality, "raw": bool(raw)}
    options = {**opts, "shard_size": limit, "shuffle": bool(shuffle), "seed": int(seed)}
    digest = hashlib.sha256(
        json.dumps(
            {
                "options": options,
                "rel": source.rel,
                "labels": source.labels,
                "extras": source.extras,
                "classes": source.classes,
            },
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    done = layout.read_manifest_if_complete(dst)
    if done is not None and done.get("digest") == digest:
        warnings.warn(
            f"{dst} already holds this pack (same input and options): nothing to do.",
            NoEffectWarning,
            stacklevel=2,
        )
        return done
    if done is not None:
        raise PttError(f"{dst!r} already holds a different pack; choose another DST or delete it.")
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(dst):  # half-written temp files of a killed run
        if ".tmp" in name and name != layout.LMDB_DIR + ".tmp" and layout.is_pack_file(name):
            os.remove(os.path.join(dst, name))
    journal = _Journal(dst, digest)
    journal.load(format, dst)
    lmdb_writer = LmdbWriter(dst, digest) if format == "lmdb" else None
    if lmdb_writer is not None:
        journal.shards = lmdb_writer.committed_chunks()
    run = _Run(source, dst, format, limit, journal, lmdb_writer, strict)
    order = _order(len(source.paths), shuffle, seed)
    start = journal.shards[-1]["src_end"] if journal.shards else 0
    jobs = [(int(order[k]), source.paths[int(order[k])], opts) for k in range(start, len(order))]
    with _progress(progress, len(order), start) as bar:
        for k, res in zip(
            range(start, len(order)), _results(jobs, workers if workers is not None else os.cpu_count() or 1)
        ):
            run.add(k, res)
            bar(res[4])
        run.close(len(order))
        elapsed_s = bar.elapsed_s()
    return _finish(run, dst, format, source, options, digest, elapsed_s, start, verify)


class _Run:
    """The shard being filled, and the closed ones (in the journal)."""

    def __init__(
        self, source: Source, dst: str, fmt: str, limit: int, journal: _Journal, lmdb: Any, strict: bool
    ):
        self.source, self.dst, self.fmt, self.limit, self.journal, self.lmdb, self.strict = (
            source,
            dst,
            fmt,
            limit,
            journal,
            lmdb,
            strict,
        )
        self.items: list[tuple[bytes, int, list[tuple[str, bytes]] | None]] = []
        self.bytes = 0
        self.rejects: list[dict[str, str]] = []
        self.payload_bytes = 0
        self.bytes_in = 0
        self.src_start = journal.shards[-1]["src_end"] if journal.shards else 0
        self.next_sample = sum(s["count"] for s in journal.shards)

    def add(self, k: int, res: tuple[Any, ...]) -> None:
        i, kind, payload, info, nbytes = res
        self.bytes_in += nbytes
        if kind == "reject":
            if self.strict:
                raise PttError(
                    f"{self.source.rel[i]}: {info} (drop --strict to skip bad files and list them)"
                )
            self.rejects.append({"path": self.source.rel[i], "reason": str(info)})
            return
        label, extras = self.source.labels[i], self.source.extras[i]
        key = f"{self.next_sample + len(self.items):09d}"
        if self.fmt == "tar":
            members = tar_sample_members(key, payload, kind, label, extras)
            size = sum(512 + (len(d) + 511) // 512 * 512 for _, d in members)
            rec = b""
        else:
            rec = encode_record(payload, label=label, kind=kind, extras=extras, shape=info)
            members, size = None, len(rec)
        if self.items and self.bytes + size > self.limit:
            self._flush(k)
        self.items.append((rec, label, members))
        self.bytes += size
        self.payload_bytes += len(payload)

    def _flush(self, src_end: int) -> None:
        labels = [lab for _, lab, _ in self.items]
        entry: dict[str, Any] = {
            "count": len(self.items),
            "src_start": self.src_start,
            "src_end": src_end,
            "first_sample": self.next_sample,
            "rejects": self.rejects,
            "payload_bytes": self.payload_bytes,
            "bytes_in": self.bytes_in,
            "class_counts": np.bincount(labels, minlength=len(self.source.classes)).tolist()
            if labels
            else [],
        }
        if self.fmt == "lmdb":
            entry["name"] = layout.LMDB_DIR
            self.lmdb.write_chunk(self.next_sample, [r for r, _, _ in self.items], entry)
        elif not self.items:  # only rejects since the last shard: journal them, write no file
            entry.update(name=None, bytes=0, sha256=None)
        else:
            name = layout.shard_name(self.fmt, sum(1 for s in self.journal.shards if s["count"]))
            path = os.path.join(self.dst, name)
            header = {k: entry[k] for k in ("src_start", "src_end", "first_sample", "rejects")}
            if self.fmt == "ptt":
                write_ptt_shard(path, [r for r, _, _ in self.items], labels, header)
            else:
                write_tar_shard(path, [m for _, _, ms in self.items for m in (ms or [])])
            entry.update(name=name, bytes=os.path.getsize(path), sha256=_sha256(path))
        self.journal.shards.append(entry)
        if self.fmt != "lmdb":
            self.journal.save()
        self.next_sample += len(self.items)
        self.items, self.bytes, self.rejects, self.payload_bytes, self.bytes_in = [], 0, [], 0, 0
        self.src_start = src_end

    def close(self, src_end: int) -> None:
        if self.items or self.rejects or src_end > self.src_start:
            self._flush(src_end)


class _progress:
    def __init__(self, show: bool, total: int, done: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._p = Progress(
            TextColumn("packing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), disable=not show
        )
        self._task = self._p.add_task("pack", total=total, completed=done)

    def __enter__(self) -> _progress:
        self._p.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.stop()

    def __call__(self, nbytes: int) -> None:
        self._p.advance(self._task)

    def elapsed_s(self) -> float:
        return float(self._p.tasks[0].elapsed or 0.0)


def _finish(
    run: _Run,
    dst: str,
    fmt: str,
    source: Source,
    options: dict[str, Any],
    digest: str,
    elapsed_s: float,
    start: int,
    verify: bool,
) -> dict[str, Any]:
    shards = run.journal.shards
    count = sum(s["count"] for s in shards)
    class_counts = np.zeros(len(source.classes), dtype=np.int64)
    for s in shards:
        if s["class_counts"]:
            class_counts += np.asarray(s["class_counts"], dtype=np.int64)
    if fmt == "lmdb":
        files = [run.lmdb.finalize(count, source.classes)]
    else:
        files = [
            {"name": s["name"], "count": s["count"], "bytes": s["bytes"], "sha256": s["sha256"]}
            for s in shards
            if s["count"] > 0
        ]
    manifest: dict[str, Any] = {
        "format": fmt,
        "version": layout.VERSION,
        "digest": digest,
        "count": count,
        "classes": source.classes,
        "class_counts": class_counts.tolist(),
        "options": options,
        "shards": files,
        "rejects": [r for s in shards for r in s["rejects"]],
        "files_in": len(source.paths),
        "bytes_in": sum(s["bytes_in"] for s in shards),
        "payload_bytes": sum(s["payload_bytes"] for s in shards),
        "bytes_out": sum(f["bytes"] for f in files),
    }
    if fmt == "tar" and files:
        manifest["pattern"] = layout.brace_pattern(len(files))
    if fmt != "tar":
        layout.write_index(dst, fmt, manifest)
    if verify:
        from pytorchtricks.shards.inspect import verify_shards

        verify_shards(dst, manifest)
    _write_json_atomic(os.path.join(dst, layout.MANIFEST), manifest)
    try:
        os.remove(run.journal.path)
    except FileNotFoundError:
        pass
    done_now = len(source.paths) - start
    return {
        **manifest,
        "elapsed_s": elapsed_s,
        "files_done": done_now,
        "images_per_s": done_now / elapsed_s if elapsed_s > 0 else None,
        "skipped_shards": sum(1 for s in shards if s["src_end"] <= start),
    }
