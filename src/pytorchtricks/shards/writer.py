"""``pack``: turn a folder or list of images into ptt, tar or lmdb shards - parallel, deterministic, resumable.

Order of work: list the source (sorted; optionally permuted with a fixed seed), process files in worker processes
(``sources.process_item``), append results in input order to the current shard, and close a shard when the next
record would pass ``shard_size``. Each closed shard is written to a temp file and renamed, then the journal
(``.pack-journal.json``) is replaced atomically. A re-run with the same options reads the journal, checks each
listed shard's sha256, and continues after the last good one: the result is byte-identical to an uninterrupted
pack. The manifest (``manifest.json``) is written last; its presence means the pack is complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import urllib.parse
import warnings
from typing import Any

import numpy as np

from pytorchtricks.core import NoEffectWarning, PttError, config_first, options_of
from pytorchtricks.data.sources import MAX_PIXELS, Source, list_source, process_item
from pytorchtricks.shards import layout
from pytorchtricks.shards._pool import WorkerDied, ordered_map
from pytorchtricks.shards.layout import parse_bytes
from pytorchtricks.shards.lmdb_format import LmdbWriter, lmdb_index
from pytorchtricks.shards.ptt_format import ptt_index, write_ptt_shard
from pytorchtricks.shards.record import encode_record
from pytorchtricks.shards.remote import is_url, scrub_url
from pytorchtricks.shards.tar_format import tar_sample_members, write_tar_shard

FORMATS = ("ptt", "tar", "lmdb")


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
        self.complete = False  # every shard is listed (saved so just before the LMDB is sealed)

    def load(self, fmt: str, dst: str) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                state = json.load(fh)
        except FileNotFoundError:
            return
        except (OSError, ValueError):  # a damaged journal: start over (it is replaced atomically, so rare)
            return
        if not isinstance(state, dict) or state.get("digest") != self.digest:
            return  # different input or options: start over
        self.complete = bool(state.get("complete"))
        for s in state.get("shards", []):
            p = os.path.join(dst, s["name"] or "")
            if (
                fmt != "lmdb"
                and s["name"]
                and (not os.path.exists(p) or layout.file_sha256(p) != s["sha256"])
            ):
                break  # keep only the verified prefix
            self.shards.append(s)

    def save(self, complete: bool = False) -> None:
        state = {"digest": self.digest, "shards": self.shards, **({"complete": True} if complete else {})}
        _write_json_atomic(self.path, state)


def _died(written: list[dict[str, Any]]) -> WorkerDied:
    """The pack's error when a worker process dies: what is kept and how to resume."""

    def message() -> str:
        kept = sum(1 for s in written if s.get("name"))
        return (
            "a pack worker process died (killed by a signal - the OOM killer, kill -9 - or crashed in an "
            f"image decoder); the {kept} shard(s) written so far are kept: re-run the same command to "
            "resume (with fewer --workers if memory ran out)."
        )

    return message


@dataclasses.dataclass(frozen=True)
class PackConfig:
    """``pack``'s options as one value: ``ptt.pack(src, dst, ptt.PackConfig(format="tar", resize=256))`` (the
    keywords of ``pack`` are a convenience over it; see there for what each does)."""

    format: str = "ptt"
    resize: int | None = None
    max_side: int | None = None
    quality: int | None = None
    raw: bool = False
    shard_size: int | str = "64MB"
    workers: int | None = None
    shuffle: bool = True
    seed: int = 0
    strict: bool = False
    verify: bool = False
    progress: bool = False
    max_pixels: int = MAX_PIXELS
    distributed: bool = False
    staging_dir: str | os.PathLike[str] | None = None
    split: str | None = None


@options_of(PackConfig)
def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: PackConfig | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Pack ``src`` (ImageFolder tree or .csv/.jsonl list) into ``dst``; returns the summary (also the manifest).

    ``dst`` may be a bucket URL (``s3://bucket/pack``, ``gs://``, ``az://``): the pack is written to a local
    staging folder (``staging_dir``, default under the shard cache; resumable as usual), then uploaded one atomic
    object at a time, the manifest last; a re-run skips what is already there (by sha256 and size).
    ``distributed=True`` under ``torchrun``: the listing is cut into chunks and every rank writes the shards of
    its own chunks (``shards/chunked.py``); rank 0 then merges the small chunk records into index and manifest.
    Shards never span two chunks, so the pack is the same bytes at any world size (not the single-process pack's:
    its shards close only at ``shard_size``). A bucket ``dst`` receives each shard as it is finished (one shard
    staged at a time per rank). Re-run the same command to resume (at any world size). Across nodes ``dst`` must be
    shared storage (a bucket, or a filesystem every node mounts). Not for ``format="lmdb"`` (one database).

    Args:
        format: ``ptt`` (indexed, random access), ``tar`` (WebDataset) or ``lmdb``.
        resize / max_side: shrink so the short side / long side is at most this (area interpolation), once.
        quality: re-encode JPEG at this quality (default 90 when resizing). raw: store decoded uint8 HWC.
        shard_size: bytes per shard (``"64MB"``). workers: processes (default: all cores; 0/1: in-process).
        shuffle, seed: store samples in a fixed-seed permuted order (better mixing for streaming readers).
        strict: fail on the first bad file instead of listing it in ``rejects``. verify: re-read every shard.
        progress: show a rich progress bar.
        split: the split of a ``src`` root that has several (a COCO root's ``instances_<split>.json``, YOLO's
            ``images/<split>/``, VOC's ``ImageSets/Main/<split>.txt``, an ImageNet-style root's ``train``/``val``);
            default: its train split, said with a ``PttWarning`` when it has others.
        max_pixels: refuse (list in ``rejects``) an image whose header declares more pixels, before decoding it;
            default ``MAX_PIXELS`` (178.9 MP, Pillow's decompression-bomb limit; about 537 MB decoded as RGB).
        config: a ``PackConfig``; the options above are its fields, given as it or as keywords (not both).

    Not packed, and listed in ``rejects`` with the reason: hidden files and folders, files outside a class folder,
    folders that cannot be listed, symlinks to folders, FIFOs/devices/sockets (never opened), files over 1 GiB,
    files that are not images or do not decode, images over ``max_pixels``. GIF/TIFF (first frame) and modes other than 8-bit
    RGB/grey/palette/alpha (16-bit grey scaled to 8 bits, CMYK) are stored converted to 8-bit RGB PNG.
    ``strict`` fails on the files it reads; what the listing skips (hidden, outside a class folder) stays listed.

    Worker processes are started with ``spawn``: a script that calls ``pack`` with workers > 1 needs the usual
    ``if __name__ == "__main__":`` guard.

    Example:
        >>> import tempfile, os, io; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/cat")
        >>> Image.new("RGB", (32, 24)).save(f"{src}/cat/a.jpg")
        >>> ptt.pack(src, tempfile.mkdtemp() + "/out", workers=0)["count"]
        1
    """
    cfg = config_first(config, PackConfig, options)  # the config, or its fields as keywords
    limit = _check_options(cfg)
    dst = os.fspath(dst)
    if is_url(dst) and not dst.lower().startswith("file://"):
        from pytorchtricks.shards.upload import check_destination

        check_destination(dst)  # before listing millions of files
    plan = _plan(cfg, list_source(*_split_source(src, cfg.split)), limit)
    if dst.lower().startswith("file://"):
        dst = urllib.parse.unquote(urllib.parse.urlsplit(dst).path)
    if cfg.distributed:
        return _pack_distributed(plan, dst, cfg.staging_dir)
    if is_url(dst):
        return _pack_to_url(plan, dst, cfg.staging_dir)
    return _pack_local(plan, dst)


def _check_options(cfg: PackConfig) -> int:
    """Refuse options that cannot work, with the fix; returns ``shard_size`` in bytes."""
    if cfg.format not in FORMATS:
        raise PttError(f"unknown format {cfg.format!r}; use one of {', '.join(FORMATS)}.")
    if cfg.raw and cfg.quality is not None:
        raise PttError("--raw stores decoded pixels; drop --quality (it applies to re-encoded JPEG only).")
    for name, v in (("resize", cfg.resize), ("max_side", cfg.max_side)):
        if v is not None and v < 1:
            raise PttError(f"{name} must be a positive number of pixels, got {v}.")
    if cfg.quality is not None and not 1 <= cfg.quality <= 100:
        raise PttError(f"quality must be in 1..100, got {cfg.quality}.")
    if int(cfg.max_pixels) < 1:
        raise PttError(f"max_pixels must be a positive number of pixels, got {cfg.max_pixels}.")
    limit = parse_bytes(cfg.shard_size)
    if limit < 1:
        raise PttError("shard_size must be positive, e.g. 64MB.")
    return limit


def _plan(cfg: PackConfig, source: Source, limit: int) -> _Plan:
    """The work for ``source``: what each worker is told (``opts``), and the digest of the options and the listing
    that the journal and the manifest carry (a re-run resumes only when it matches)."""
    opts = {
        "format": cfg.format,
        "resize": cfg.resize,
        "max_side": cfg.max_side,
        "quality": cfg.quality,
        "raw": bool(cfg.raw),
        "max_pixels": int(cfg.max_pixels),
    }
    options = {**opts, "shard_size": limit, "shuffle": bool(cfg.shuffle), "seed": int(cfg.seed)}
    if cfg.distributed:  # chunk-aligned shards (shards/chunked.py): another pack than the single-process one
        if cfg.format == "lmdb":
            raise PttError(
                "--distributed writes each chunk's shards in the rank that owns it; an LMDB pack is one database "
                "that one process writes: pack with --format ptt or tar, or without --distributed."
            )
        options["layout"] = "chunks"
    # defaults stay out of the digest: packs made before these existed keep theirs
    if options["max_pixels"] == MAX_PIXELS:
        del options["max_pixels"]
    listed = {"rel": source.rel, "labels": source.labels, "extras": source.extras, "classes": source.classes}
    if source.skipped:
        listed["skipped"] = source.skipped
    digest = hashlib.sha256(
        json.dumps(
            {"options": options, **listed},
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    return _Plan(
        source,
        opts,
        options,
        digest,
        limit,
        cfg.shuffle,
        cfg.seed,
        cfg.workers,
        cfg.strict,
        cfg.verify,
        cfg.progress,
    )


def _split_source(
    src: str | os.PathLike[str], split: str | None
) -> tuple[str | os.PathLike[str], str | None]:
    """(what to list, the split left for the listing): an ImageNet-style root's split is its folder; a detection
    root's split is read by ``open_detection``."""
    from pytorchtricks.data.detection import detection_layout
    from pytorchtricks.data.folder import split_folder

    if split is None or detection_layout(src) is not None:
        return src, split
    return split_folder(src, split), None


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What ``pack`` checked and listed: everything the work needs, whichever process does it."""

    source: Source
    opts: dict[str, Any]
    options: dict[str, Any]
    digest: str
    limit: int
    shuffle: bool
    seed: int
    workers: int | None
    strict: bool
    verify: bool
    progress: bool

    def jobs(self, order: np.ndarray, lo: int, hi: int) -> list[tuple[int, str, dict[str, Any]]]:
        return [(int(order[k]), self.source.paths[int(order[k])], self.opts) for k in range(lo, hi)]

    def n_workers(self) -> int:
        return self.workers if self.workers is not None else os.cpu_count() or 1


def _staging(url: str, staging_dir: Any) -> str:
    from pytorchtricks.shards.cache import default_cache_dir

    key = hashlib.sha256(scrub_url(url).encode()).hexdigest()[:16]
    return os.fspath(staging_dir or os.path.join(default_cache_dir(), "staging", key))


def _pack_to_url(plan: _Plan, url: str, staging_dir: Any) -> dict[str, Any]:
    from pytorchtricks.shards.upload import check_destination, remote_manifest, upload_pack

    check_destination(url)
    there = remote_manifest(url)
    if there is not None and there.get("digest") == plan.digest:
        warnings.warn(
            f"{scrub_url(url)} already holds this pack: nothing to do.", NoEffectWarning, stacklevel=3
        )
        return there
    if there is not None:
        raise PttError(f"{scrub_url(url)} already holds a different pack; choose another DST or delete it.")
    staging = _staging(url, staging_dir)
    summary = _pack_local(plan, staging)
    upload_pack(staging, url)
    return summary


def _pack_distributed(plan: _Plan, dst: str, staging_dir: Any) -> dict[str, Any]:
    """Under torchrun: every rank writes the shards of its own chunks into ``dst`` (``shards/chunked.py``), then
    rank 0 merges the chunk records into the index and the manifest. Returns the manifest, on every rank, with
    ``"rank_stats"``: what this rank wrote (chunks, files, shard bytes, seconds) and, on rank 0, ``merge_s``."""
    import datetime

    import torch.distributed as dist

    from pytorchtricks.clock import now_s
    from pytorchtricks.shards import chunked

    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing and not dist.is_initialized():
        raise PttError(
            f"--distributed needs torchrun's environment ({', '.join(missing)} missing): launch with "
            "`torchrun --nnodes N --nproc-per-node P -m pytorchtricks pack SRC DST --distributed`."
        )
    own_group = not dist.is_initialized()
    if own_group:  # packing shards for hours before the barrier: a long timeout
        dist.init_process_group("gloo", timeout=datetime.timedelta(days=1))
    rank, world = dist.get_rank(), dist.get_world_size()
    # a bucket's shards are staged one at a time per rank, then PUT; a local pack is written in place
    staging = _staging(dst, staging_dir) if is_url(dst) else os.path.join(dst, ".pack-staging")
    target = chunked.Target(dst, os.path.join(staging, f"rank{rank}"))
    try:
        done = target.manifest()
        if done is not None and done.get("digest") != plan.digest:
            raise PttError(
                f"{scrub_url(dst)} already holds a different pack; choose another DST or delete it."
            )
        if done is not None and rank == 0:
            chunked.clean(target, done)  # a kill between the manifest and the clean-up left chunk records
        stats: dict[str, Any] = {"rank": rank, "world": world, "chunks": 0, "files": 0, "shard_bytes": 0}
        if done is None:
            n = len(plan.source.paths)
            order = _order(n, plan.shuffle, plan.seed)
            t0 = now_s()
            stats.update(chunked.write_chunks(plan, order, target, rank, world, _died([])))
            stats["write_s"] = now_s() - t0
            dist.barrier()
            if rank == 0:
                t0 = now_s()
                chunked.merge_chunks(plan, n, target)
                stats["merge_s"] = now_s() - t0
        dist.barrier()
        manifest = target.manifest()
        if manifest is None:
            raise PttError(f"rank 0 did not finish {scrub_url(dst)}: run the same command again.")
        return {**manifest, "rank_stats": stats}
    finally:
        shutil.rmtree(target.staging, ignore_errors=True)
        if own_group:
            dist.destroy_process_group()


def _pack_local(plan: _Plan, dst: str) -> dict[str, Any]:
    """The single-process pack into the local folder ``dst``."""
    source, opts, options, digest, limit = plan.source, plan.opts, plan.options, plan.digest, plan.limit
    format, verify, progress, strict = opts["format"], plan.verify, plan.progress, plan.strict
    done = layout.read_manifest_if_complete(dst)
    if done is not None and done.get("digest") == digest:
        warnings.warn(
            f"{dst} already holds this pack (same input and options): nothing to do.",
            NoEffectWarning,
            stacklevel=4,
        )
        _clean(dst, format, done)  # a kill between the manifest and the cleanup left these
        return done
    if done is not None:
        raise PttError(f"{dst!r} already holds a different pack; choose another DST or delete it.")
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(dst):  # half-written temp files of a killed run
        if ".tmp" in name and name != layout.LMDB_DIR + ".tmp" and layout.is_pack_file(name):
            os.remove(os.path.join(dst, name))
    journal = _Journal(dst, digest)
    journal.load(format, dst)
    lmdb_writer, results = None, None
    if format == "lmdb":
        lmdb_writer = LmdbWriter(dst, digest, journal.shards if journal.complete else None)
        journal.shards = lmdb_writer.committed_chunks()  # the LMDB's own progress record is the truth
    try:
        run = _Run(source, dst, format, limit, journal, lmdb_writer, strict)
        run.resize = (opts.get("resize"), opts.get("max_side"))
        order = _order(len(source.paths), plan.shuffle, plan.seed)
        start = journal.shards[-1]["src_end"] if journal.shards else 0
        results = ordered_map(
            process_item, plan.jobs(order, start, len(order)), plan.n_workers(), _died(journal.shards)
        )
        with _progress(progress, len(order), start) as bar:
            for k, res in zip(range(start, len(order)), results, strict=True):
                run.add(k, res)
                bar(res[4])
            run.close(len(order))
            elapsed_s = bar.elapsed_s()
        return _finish(run, dst, format, source, options, digest, elapsed_s, start, verify)
    finally:
        if results is not None:
            results.close()  # on an error (--strict, a dead worker, Ctrl-C): stop the pool now, not at GC
        if lmdb_writer is not None:
            lmdb_writer.close()


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
        self.resize: tuple[int | None, int | None] = (None, None)  # (resize, max_side): boxes follow them

    def add(self, k: int, res: tuple[Any, ...]) -> None:
        i, kind, payload, info, nbytes = res
        if kind == "reject":
            self.bytes_in += nbytes
            if self.strict:
                raise PttError(
                    f"{self.source.rel[i]}: {info} (drop --strict to skip bad files and list them)"
                )
            self.rejects.append({"path": self.source.rel[i], "reason": str(info)})
            return
        label, extras = self.source.labels[i], self.source.extras[i]
        if "target" in extras or "boxes" in extras:  # boxes live in pixels: they follow a pack-time resize
            from pytorchtricks.shards.targets import boxes_follow

            try:
                extras = boxes_follow(extras, payload, kind, info, self.source.paths[i], self.resize)
            except ValueError as exc:
                self.bytes_in += nbytes
                if self.strict:
                    raise PttError(
                        f"{self.source.rel[i]}: {exc} (drop --strict to list it in rejects)"
                    ) from exc
                self.rejects.append({"path": self.source.rel[i], "reason": str(exc)})
                return
        key = f"{self.next_sample + len(self.items):09d}"
        if self.fmt == "tar":
            members = tar_sample_members(key, payload, kind, label, extras)
            size = sum(512 + (len(d) + 511) // 512 * 512 for _, d in members)
            rec = b""
        else:
            rec = encode_record(payload, label=label, kind=kind, extras=extras, shape=info)
            members, size = None, len(rec)
        if self.items and self.bytes + size > self.limit:
            self._flush(k)  # file k opens the next shard: its bytes_in is counted there, once
        self.bytes_in += nbytes
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
            entry.update(name=name, bytes=os.path.getsize(path), sha256=layout.file_sha256(path))
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
        run.journal.save(complete=True)  # the chunk list, before the seal removes it from the LMDB
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
        "rejects": [*source.skipped, *(r for s in shards for r in s["rejects"])],
        "files_in": len(source.paths),
        "bytes_in": sum(s["bytes_in"] for s in shards),
        "payload_bytes": sum(s["payload_bytes"] for s in shards),
        "bytes_out": sum(f["bytes"] for f in files),
    }
    if source.detection is not None:
        from pytorchtricks.shards.targets import manifest_summary

        manifest["detection"] = manifest_summary(source, manifest["rejects"], options)
    if fmt == "tar" and files:
        manifest["pattern"] = layout.brace_pattern(len(files))
    if fmt == "ptt":
        index = ptt_index(dst, manifest)
        layout.save_index(dst, index)
        if "detection" in manifest:  # every target in one file, for readers that need them all at once
            from pytorchtricks.shards.targets import write_targets

            manifest["detection"]["targets"] = write_targets(dst, index, manifest["shards"])
    elif fmt == "lmdb":
        layout.save_index(dst, lmdb_index(os.path.join(dst, layout.LMDB_DIR), manifest["count"]))
    if verify:
        from pytorchtricks.shards.inspect import verify_shards

        verify_shards(dst, manifest)
    _write_json_atomic(os.path.join(dst, layout.MANIFEST), manifest)
    _clean(dst, fmt, manifest)
    done_now = len(source.paths) - start
    return {
        **manifest,
        "elapsed_s": elapsed_s,
        "files_done": done_now,
        "images_per_s": done_now / elapsed_s if elapsed_s > 0 else None,
        "skipped_shards": sum(1 for s in shards if s["src_end"] <= start),
    }


def _clean(dst: str, fmt: str, manifest: dict[str, Any]) -> None:
    """Remove what a complete pack does not list: the journal, temp files, and the shards, index or LMDB of an
    earlier pack abandoned in ``dst`` (only names ``ptt pack`` writes; other files are left alone)."""
    keep = {s["name"] for s in manifest.get("shards", [])}
    for name in os.listdir(dst):
        path = os.path.join(dst, name)
        stale = (
            name == layout.JOURNAL
            or name == layout.LMDB_DIR + ".tmp"
            or (".tmp" in name and layout.is_pack_file(name))
            or (name.startswith("shard-") and layout.is_pack_file(name) and name not in keep)
            or (name == layout.INDEX and fmt == "tar")
            or (name == layout.LMDB_DIR and fmt != "lmdb")
            or (name == layout.TARGETS and "targets" not in (manifest.get("detection") or {}))
        )
        if stale:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
