"""Multi-node jobs for real: torchrun agents with c10d rendezvous on 127.0.0.1 (2 nodes x 2 ranks x 2 DataLoader
workers, gloo), reading a pack from moto's S3 server through one shard cache per node; an agent killed mid-epoch
and the job resumed at world size 2; and ``ptt pack --distributed`` on 2 nodes byte-identical to its world-size-1 pack."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from PIL import Image

from pytorchtricks.shards.cache import NodeCache
from pytorchtricks.shards.writer import pack

pytestmark = pytest.mark.slow
N = 48

JOB = r"""
import json, os, sys, time
import torch.distributed as dist
from pytorchtricks.shards.stream import ShardStream
from pytorchtricks.tricks.data.make_loader import make_loader

url, out, cache_root, resume, stop_after = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo")
rank, world, node = dist.get_rank(), dist.get_world_size(), int(os.environ["GROUP_RANK"])
stream = ShardStream(url, seed=7, decode=None, cache_dir=f"{cache_root}/node{node}", buffer_size=6)
loader = make_loader(stream, 4, crop=None, flip=False, num_workers=2, drop_last=False, seed=1)
epochs = [0, 1]
if resume != "-":
    with open(resume) as fh:
        loader.load_state_dict(json.load(fh))
    epochs = [loader.epoch]
log = open(f"{out}/rank{rank}-world{world}.jsonl", "a")
for epoch in epochs:
    if resume == "-":
        loader.set_epoch(epoch)
    for step, (x, _) in enumerate(loader):
        log.write(json.dumps({"epoch": epoch, "step": step, "ids": (x[:, 0, 0, 0] // 5).tolist()}) + "\n")
        log.flush()
        dist.barrier()  # the ranks step in lockstep, as DDP's all-reduce makes them
        if resume == "-" and epoch == 1 and step + 1 == stop_after:
            if rank == 0:  # the checkpoint: any rank's state resumes every rank
                with open(f"{out}/state.tmp", "w") as fh:
                    json.dump(loader.state_dict(), fh)
                os.replace(f"{out}/state.tmp", f"{out}/state.json")
            time.sleep(300)  # mid-epoch: the test kills an agent here
dist.barrier()
dist.destroy_process_group()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def coded_src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coded-src")
    for i in range(N):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        px = np.random.default_rng(i).integers(0, 256, (24, 24, 3), dtype=np.uint8)
        px[..., 0] = 5 * i  # the id, read back from the batches
        Image.fromarray(px).save(root / f"c{i % 2}" / f"{i:02d}.png")
    return root


def _agents(target: list[str], nnodes: int, tmp: Path, tag: str) -> list[subprocess.Popen]:
    """``nnodes`` torchrun agents of 2 ranks each on this machine, meeting at a c10d rendezvous on 127.0.0.1."""
    port = _port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = []
    for node in range(nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tag,
               "--local-addr", "127.0.0.1", "--max-restarts", "0", *target]  # fmt: skip
        log = open(tmp / f"agent-{tag}-{node}.log", "w")  # noqa: SIM115  (closed with the process)
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    return procs


def _kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL an agent and everything under it (torchrun starts each rank in its own session)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _kill_node(p)


def _logs(tmp: Path, tag: str) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(tmp.glob(f"agent-{tag}-*.log")))


def _steps(out: Path, world: int) -> dict[int, list[dict]]:
    return {
        int(p.name[4 : p.name.index("-")]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in out.glob(f"rank*-world{world}.jsonl")
    }


def test_two_nodes_exactly_once_then_an_agent_killed_and_the_epoch_resumed_at_world_size_2(
    s3_bucket, coded_src, tmp_path
):
    fs, bucket = s3_bucket
    url = f"s3://{bucket}/coded"
    pack(coded_src, url, shard_size=6000, workers=0, staging_dir=tmp_path / "staging")  # ~10 shards
    shards = len(json.loads(fs.cat_file(f"{bucket}/coded/manifest.json"))["shards"])
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    procs = _agents([str(script), url, str(out), str(cache), "-", "1"], 2, tmp_path, "job1")
    try:
        deadline = time.monotonic() + 150
        while not (out / "state.json").exists():
            assert time.monotonic() < deadline, "no checkpoint:\n" + _logs(tmp_path, "job1")
            assert all(p.poll() is None for p in procs), "a job failed:\n" + _logs(tmp_path, "job1")
            time.sleep(0.2)
        _kill_node(procs[1])  # one node's agent and its ranks die mid-epoch
    finally:
        _kill(procs)  # the job is gone; the scheduler restarts it on what is left
    state = json.loads((out / "state.json").read_text())
    assert state["batches"] == 1 and state["stream"]["world_size"] == 4 and state["stream"]["epoch"] == 1

    # epoch 0: every sample exactly once across 2 nodes x 2 ranks x 2 workers, equal batches on every rank
    first = _steps(out, 4)
    assert sorted(first) == [0, 1, 2, 3]
    epoch0 = [i for r in first.values() for s in r if s["epoch"] == 0 for i in s["ids"]]
    assert sorted(epoch0) == list(range(N))
    assert len({sum(1 for s in r if s["epoch"] == 0) for r in first.values()}) == 1
    for node in (0, 1):  # one download per shard per node, whatever the ranks, workers and epochs
        stats = NodeCache(cache / f"node{node}").stats()
        assert 0 < stats["downloads"] <= shards + 1 and stats["hits"] > 0

    # resume epoch 1 on one node (world size 2) from the checkpoint: with what the 4 ranks took, exactly the dataset
    procs = _agents(
        [str(script), url, str(out), str(cache), str(out / "state.json"), "0"], 1, tmp_path, "job2"
    )
    try:
        assert procs[0].wait(timeout=150) == 0, _logs(tmp_path, "job2")
    finally:
        _kill(procs)
    before = [
        i
        for r in first.values()
        for s in r
        if s["epoch"] == 1 and s["step"] < state["batches"]
        for i in s["ids"]
    ]
    after = [i for r in _steps(out, 2).values() for s in r for i in s["ids"]]
    assert len(before) == 4 * 4 and len(after) == N - 16
    assert collections.Counter(before + after) == collections.Counter(range(N))


def test_distributed_pack_on_two_nodes_is_the_world_size_1_pack(coded_src, tmp_path):
    """``torchrun --nnodes 2 --nproc-per-node 2 -m pytorchtricks pack SRC DST --distributed``: every file (shards,
    index, manifest) is the bytes of the same pack made by one process in a group of one (chunk-aligned shards do
    not depend on the world size); a second run of the command finds the pack complete and changes nothing."""
    ref = tmp_path / "ref"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        pack(coded_src, ref, shard_size=6000, workers=0, distributed=True)
    finally:
        dist.destroy_process_group()
    dst = tmp_path / "dist"
    target = ["-m", "pytorchtricks", "pack", str(coded_src), str(dst), "--distributed", "--shard-size", "6000",
              "--workers", "0"]  # fmt: skip
    for run in ("pack", "again"):
        procs = _agents(target, 2, tmp_path, run)
        try:
            for p in procs:
                assert p.wait(timeout=150) == 0, _logs(tmp_path, run)
        finally:
            _kill(procs)
        assert sorted(os.listdir(dst)) == sorted(os.listdir(ref))  # no chunk records, temp or staging left
        for name in os.listdir(ref):
            assert (dst / name).read_bytes() == (ref / name).read_bytes(), name
