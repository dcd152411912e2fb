"""Reading a pack from object storage: ptt ShardStream from a local S3 server vs the same pack on local disk vs
LitData's StreamingDataset reading the same photos from the same server.

One S3 API server (moto's standalone server, its own process, on 127.0.0.1) holds a ptt pack and a LitData
optimize() of the same JPEG files (same chunk size). Each system runs in its own child process (LitData in the
peers environment) and reads the stored records - the JPEG bytes, no decode, which would be the same work for
every system - with 2 DataLoader workers, batches of 64, shuffled, for 2 epochs through a fresh cache folder (one
node). Reported per epoch: images/s; per run: the bytes the server sent (its process's socket writes, read from
/proc: the same meter for every system), the dataset's bytes, and for ptt the cache hit rate (shard requests served
from the node cache / all shard requests). The "cache50" rows bound the cache to half the pack.

Loopback is not a network: images/s here are an upper bound set by this machine's CPUs (and the S3 server shares
them); what transfers to a real cluster is bytes downloaded per node and the cache hit rate.

    make bench-remote                                  # REMOTE_IMAGES=2000 photos from data/photos
    .venv/bin/python benchmarks/remote_read.py --src data/photos --images 500
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from typing import Any

from _child import emit, run_child  # benchmarks/ is on sys.path: these run as scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, WORKERS, CHUNK = 64, 2, "8MB"
BUFFER = (
    256  # ptt's shuffle window in samples: about 2-3 shards of photos, so a bounded cache is not thrashed
)
SYSTEMS: dict[str, tuple[str, str]] = {
    "ptt-disk": ("core", "ptt ShardStream on the pack in a local folder"),
    "ptt-s3": ("core", "ptt ShardStream on s3:// through the node cache (unbounded)"),
    "ptt-s3-cache50": ("core", "ptt ShardStream on s3://, cache_limit = 50% of the pack (LRU eviction)"),
    "litdata-s3": ("peers", "LitData StreamingDataset + StreamingDataLoader on s3:// (its cache, unbounded)"),
    "litdata-s3-cache50": ("peers", "LitData on s3://, max_cache_size = 50% of its chunks"),
}
SERVER = """
import logging, sys, threading
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

app = DomainDispatcherApplication(create_backend_app)
sent = [0]  # response body bytes: what every client downloaded, metered the same way for each system

def counting(environ, start_response):
    for chunk in app(environ, start_response):
        sent[0] += len(chunk)
        yield chunk

server = make_server("127.0.0.1", int(sys.argv[1]), counting, True, request_handler=MotoRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
for _ in sys.stdin:  # one line in: the bytes sent so far, out
    print(sent[0], flush=True)
server.shutdown()
"""


def _now() -> float:
    from pytorchtricks.clock import now_s

    return now_s()


def _collate(batch: list[Any]) -> list[tuple[bytes, int]]:
    """``(JPEG bytes, label)`` per sample, copied out of the reader's buffers (LitData hands out memoryviews, which
    cannot cross from a worker process): the same copy for every system."""
    if batch and isinstance(batch[0], dict):
        return [(bytes(item["jpg"]), int(item["cls"])) for item in batch]
    return [(bytes(item[0]), int(item[1])) for item in batch]


# ------------------------------------------------------------------------------------------------ children


def _read_epochs(make_loader: Any, epochs: int, n: int) -> list[float]:
    rates = []
    for epoch in range(epochs):
        loader = make_loader(epoch)
        t0, got = _now(), 0
        for batch in loader:
            got += len(batch)
        rates.append(got / (_now() - t0))
        if got != n:
            raise RuntimeError(f"epoch {epoch} read {got} samples, expected {n}")
    return rates


def run_ptt(system: str, where: str, work: str, n: int, epochs: int, pack_bytes: int) -> dict[str, Any]:
    import torch

    from pytorchtricks.shards.cache import NodeCache
    from pytorchtricks.shards.stream import ShardStream

    cache = os.path.join(work, f"cache-{system}")
    shutil.rmtree(cache, ignore_errors=True)
    limit = max(pack_bytes // 2, 1) if system.endswith("cache50") else None

    def loader(epoch: int) -> Any:
        kw = {} if system == "ptt-disk" else {"cache_dir": cache, "cache_limit": limit}
        s = ShardStream(where, seed=0, decode=None, batch_size=BATCH, buffer_size=BUFFER, **kw)
        s.set_epoch(epoch)
        return torch.utils.data.DataLoader(s, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate)

    rates = _read_epochs(loader, epochs, n)
    out: dict[str, Any] = {"images_per_s": rates}
    if system != "ptt-disk":
        st = NodeCache(cache).stats()
        out.update(cache_stats=st, cache_hit_rate=st["hits"] / max(1, st["hits"] + st["misses"]))
    return out


def run_litdata(system: str, where: str, work: str, n: int, epochs: int, pack_bytes: int) -> dict[str, Any]:
    import litdata as ld
    import litdata.streaming.downloader as lit_downloader

    # LitData's obstore chunk reader builds its client without allow_http, so a plain-http endpoint (this local
    # server) fails there; its boto3 path (the one it uses for the index, and without obstore) reads it.
    lit_downloader._OBSTORE_AVAILABLE = False
    cache = os.path.join(work, f"cache-{system}")
    shutil.rmtree(cache, ignore_errors=True)
    kw: dict[str, Any] = {"storage_options": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
    if system.endswith("cache50"):
        kw["max_cache_size"] = max(pack_bytes // 2, 1)

    def loader(epoch: int) -> Any:
        ds = ld.StreamingDataset(where, cache_dir=cache, shuffle=True, seed=0, **kw)
        ds.set_epoch(epoch + 1)  # LitData counts epochs from 1
        return ld.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate)

    return {"images_per_s": _read_epochs(loader, epochs, n)}


# ------------------------------------------------------------------------------------------------ parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listing(src: str, n: int, work: str) -> tuple[str, list[tuple[str, int]]]:
    """The first ``n`` photos (sorted per class, classes interleaved) as a CSV list ``ptt pack`` reads."""
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    per = [sorted(os.listdir(os.path.join(src, c))) for c in classes]
    items: list[tuple[str, int]] = []
    for k in range(max(map(len, per))):
        for label, names in enumerate(per):
            if k < len(names) and len(items) < n:
                items.append((os.path.join(src, classes[label], names[k]), label))
    if len(items) < n:
        raise SystemExit(f"{src} holds {len(items)} photos, fewer than --images {n} (make data)")
    csv = os.path.join(work, f"list-{n}.csv")
    with open(csv, "w", encoding="utf-8") as fh:
        fh.write("path,label\n" + "".join(f"{p},{lab}\n" for p, lab in items))
    return csv, items


def _lit_item(item: tuple[str, int]) -> dict[str, Any]:
    with open(item[0], "rb") as fh:
        return {"jpg": fh.read(), "cls": item[1]}


def _server_sent(server: subprocess.Popen[bytes]) -> int:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(b"?\n")
    server.stdin.flush()
    return int(server.stdout.readline())


def _markdown(rows: list[dict[str, Any]], n: int, pack_bytes: int, env: dict[str, Any], note: str) -> str:
    lines = [
        f"# Reading {n} photos ({pack_bytes / 1e6:.0f} MB of shards) from a local S3 server vs local disk",
        "",
        f"{env['cpu']} ({env['cpu_count']} CPUs), {env['time_utc']}, git {env.get('git_sha')}. {note}",
        "Stored records (JPEG bytes, no decode), 2 DataLoader workers, batches of 64, shuffled, one node, a fresh "
        "cache. **Loopback is not a network**: images/s are bounded by this machine's CPUs, which the S3 server "
        "shares; bytes downloaded per node and the cache hit rate are what transfer to a cluster. Downloaded: the "
        "response bytes the S3 server sent (metered inside the server, the same for every system); cache hit rate: "
        "the shard requests (one per reader and shard it opens) served from the node cache. One run.",
        "",
        "| system | epoch 1 images/s | epoch 2 images/s | downloaded per node (MB) | x dataset | cache hit rate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['system']} | error: {r['error'][:80]} | | | | |")
            continue
        rates = r["images_per_s"] + [float("nan")] * 2
        sent = r.get("server_bytes_sent")
        mb = "-" if sent is None else f"{sent / 1e6:.1f}"
        ratio = "-" if sent is None else f"{sent / r['dataset_bytes']:.2f}"
        hit = "-" if r.get("cache_hit_rate") is None else f"{r['cache_hit_rate']:.0%}"
        lines.append(f"| {r['system']} | {rates[0]:.0f} | {rates[1]:.0f} | {mb} | {ratio} | {hit} |")
    lines += ["", *(f"- `{s}`: {d}" for s, (_, d) in SYSTEMS.items()), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=os.path.join(ROOT, "data", "photos"))
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--work", default="/tmp/ptt-bench-remote")
    from pytorchtricks.hardware import cpu_caps  # results are filed by CPU class

    ap.add_argument("--out", default=os.path.join(ROOT, "results", cpu_caps().cpu_class))
    ap.add_argument("--peers-python", default=os.path.join(ROOT, ".venv-peers", "bin", "python"))
    ap.add_argument("--note", default="The machine was shared with other jobs while this ran.")
    ap.add_argument(
        "--render-only", action="store_true", help="rewrite the .md from the .jsonl, time nothing"
    )
    ap.add_argument("--run-one", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.render_only:
        stem = os.path.join(args.out, f"remote_read-{args.images}")
        with open(stem + ".jsonl", encoding="utf-8") as fh:
            done = [json.loads(line) for line in fh if line.strip()]
        size = next(r["dataset_bytes"] for r in done if r["system"].startswith("ptt"))
        md = _markdown(done, args.images, size, done[0]["env"], args.note)
        with open(stem + ".md", "w", encoding="utf-8") as fh:
            fh.write(md)
        print(md)
        return 0
    if args.run_one:
        system, where, n, pack_bytes, epochs = args.run_one
        run = run_litdata if system.startswith("litdata") else run_ptt
        res = run(system, where, args.work, int(n), int(epochs), int(pack_bytes))
        emit(res)
        return 0

    from pytorchtricks.clock import environment, write_results
    from pytorchtricks.shards.writer import pack

    work = os.path.join(args.work, f"n{args.images}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    csv, items = _listing(args.src, args.images, work)
    port = _port()
    env_vars = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",  # obstore (LitData's chunk reader) refuses plain http otherwise
    }
    os.environ.update(env_vars)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir("bench")
        local = os.path.join(work, "ptt")
        summary = pack(csv, local, shard_size=CHUNK, shuffle=False, workers=0)
        fs.put(local + "/", "bench/ptt/", recursive=True)
        pack_bytes = int(summary["bytes_out"])
        lit_local, lit_bytes = os.path.join(work, "litdata"), 0
        wanted = [s for s in args.systems.split(",") if s]
        if any(s.startswith("litdata") for s in wanted) and os.path.exists(args.peers_python):
            conv = (
                "import sys, json; sys.path.insert(0, sys.argv[1]); import remote_read as rr, litdata as ld; "
                "items = json.load(open(sys.argv[2])); "
                "ld.optimize(fn=rr._lit_item, inputs=[tuple(i) for i in items], output_dir=sys.argv[3], "
                f"chunk_bytes='{CHUNK}', num_workers=1)"
            )
            with open(os.path.join(work, "items.json"), "w") as fh:
                json.dump(items, fh)
            subprocess.run(
                [
                    args.peers_python,
                    "-c",
                    conv,
                    os.path.dirname(__file__),
                    os.path.join(work, "items.json"),
                    lit_local,
                ],
                check=True,
                capture_output=True,
            )
            fs.put(lit_local + "/", "bench/litdata/", recursive=True)
            lit_bytes = sum(os.path.getsize(os.path.join(lit_local, f)) for f in os.listdir(lit_local))
        rows = []
        for system in wanted:
            kind = SYSTEMS[system][0]
            py = sys.executable if kind == "core" else args.peers_python
            where = {"ptt-disk": local}.get(system, "s3://bench/" + ("litdata" if kind == "peers" else "ptt"))
            size = lit_bytes if kind == "peers" else pack_bytes
            row: dict[str, Any] = {"system": system, "images": args.images, "dataset_bytes": size}
            if not os.path.exists(py):
                row["error"] = "peers environment missing (make peers-env)"
            else:
                before = _server_sent(server)
                cmd = [py, os.path.abspath(__file__), "--work", work, "--run-one", system, where,
                       str(args.images), str(size), str(args.epochs)]  # fmt: skip
                row.update(run_child(cmd, 1800, ROOT, error_chars=600))
                if "error" not in row and system != "ptt-disk":
                    row["server_bytes_sent"] = _server_sent(server) - before
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
    env = environment()
    env["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    md = _markdown(rows, args.images, pack_bytes, env, args.note)
    write_results(os.path.join(args.out, f"remote_read-{args.images}"), [{**r, "env": env} for r in rows], md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
