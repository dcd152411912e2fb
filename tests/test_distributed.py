"""ptt.distributed and accumulate_gradients under 2-process gloo DDP on CPU (torch.multiprocessing spawn).

One spawn runs every check (each child pays for importing torch once); the tests assert on its results.
Accumulation: K=4 micro-steps per rank == one full batch in one process (max diff <= 1e-6), and no_sync verified by
counting DDP all-reduces with a comm hook (a naive loop without no_sync all-reduces K times per step).
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.fixtures import tiny_mlp

WORLD = 2
K = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )  # fmt: skip


def _accumulation_case(
    make: Any, shape: tuple[int, ...], rank: int, sizes: list[int] | None
) -> dict[str, Any]:
    """Two optimizer steps; returns the max parameter difference to the 1-process full batch and all-reduce counts."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(32, *shape, generator=g), torch.randint(0, 5, (32,), generator=g)
    lossf = nn.functional.cross_entropy
    ref = make()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    ddp = DDP(make())
    calls = [0]

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        calls[0] += 1
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
    if sizes is None:  # equal shards, equal micro-batches
        xs, ys = x.chunk(WORLD)[rank], y.chunk(WORLD)[rank]
        micro = [len(xs) // K] * K
    else:  # unequal shards and micro-batches: weights make it exact
        lo = sum(sum(s) for s in sizes[:rank]) if isinstance(sizes[0], list) else 0
        micro = sizes[rank]  # type: ignore[assignment]
        xs, ys = x[lo : lo + sum(micro)], y[lo : lo + sum(micro)]
    per_step = []
    for _ in range(2):
        lossf(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        before = calls[0]
        with ptt.accumulate_gradients(ddp, opt, steps=K) as acc:
            for xb, yb in zip(xs.split(micro), ys.split(micro)):
                acc.backward(lossf(ddp(xb), yb), weight=len(xb) if sizes is not None else None)
        per_step.append(calls[0] - before)
    diff = max((p - q).abs().max().item() for p, q in zip(ref.parameters(), ddp.module.parameters()))
    # the same loop without no_sync: every micro-step all-reduces (proves the counter sees all-reduces)
    before = calls[0]
    for xb, yb in zip(xs.split(micro), ys.split(micro)):
        lossf(ddp(xb), yb).backward()
    naive = calls[0] - before
    return {"max_diff": diff, "allreduce_per_step": per_step, "allreduce_naive": naive}


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(port)}
    )  # fmt: skip
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    res: dict[str, Any] = {}
    info = ptt.distributed.setup(seed=100, device="cpu")
    res["info"] = [info.rank, info.world_size, info.backend, info.seed, info.is_main]
    res["rand"] = torch.rand(3).tolist()
    res["mlp"] = _accumulation_case(tiny_mlp, (12,), rank, None)
    res["cnn"] = _accumulation_case(_cnn, (3, 9, 9), rank, None)
    res["mlp_weighted"] = _accumulation_case(tiny_mlp, (12,), rank, [[2, 3, 4, 1], [8, 6, 5, 3]])
    # SyncBatchNorm runs on CUDA/XPU only: on CPU we can check the conversion, not the statistics
    bn = ptt.distributed.to_sync_batchnorm_(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    res["syncbn_type"] = type(bn[1]).__name__
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))  # written before teardown: see `results`
    ptt.distributed.cleanup()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    try:
        mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    except mp.ProcessExitedException as exc:
        # A child can abort while the interpreter exits (gloo/TCPStore threads: "terminate called without an
        # active exception", once in ~50 runs on a loaded 2-core machine). Every check ran before teardown and
        # wrote its file; a crash before that leaves a file missing and fails here.
        if not all((out / f"rank{r}.json").exists() for r in range(WORLD)):
            raise
        warnings.warn(f"a rank crashed after writing its results (teardown): {exc}", stacklevel=1)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
def test_setup_reads_torchrun_env_and_seeds_per_rank(results: list[dict[str, Any]]) -> None:
    assert results[0]["info"] == [0, 2, "gloo", 100, True]
    assert results[1]["info"] == [1, 2, "gloo", 101, False]
    assert results[0]["rand"] != results[1]["rand"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mlp", "cnn", "mlp_weighted"])
def test_ddp_accumulation_equals_full_batch_with_no_sync(results: list[dict[str, Any]], case: str) -> None:
    for r in results:
        assert r[case]["max_diff"] <= 1e-6, r[case]
        buckets = r[case]["allreduce_per_step"][0]
        assert buckets >= 1 and r[case]["allreduce_per_step"] == [buckets, buckets]  # once per K micro-steps
        assert r[case]["allreduce_naive"] == K * buckets  # without no_sync: K times


@pytest.mark.slow
def test_sync_batchnorm_conversion(results: list[dict[str, Any]]) -> None:
    assert all(r["syncbn_type"] == "SyncBatchNorm" for r in results)


def test_single_process_setup_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    info = ptt.distributed.setup(seed=5, device="cpu")
    assert (info.rank, info.world_size, info.distributed, info.seed) == (0, 1, False, 5)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ptt.PttError, match="torchrun"):
        ptt.distributed.setup(device="cpu")
    with pytest.warns(ptt.NoEffectWarning):
        ptt.distributed.to_sync_batchnorm_(nn.Linear(2, 2))
