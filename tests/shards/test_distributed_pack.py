"""``ptt pack --distributed``: every rank writes its own chunks' shards, rank 0 only merges the chunk records.

Ranks are real processes in a real gloo group (a driver in a fresh interpreter forks one child per rank, meeting
through a FileStore: no torch import per rank), each logging every file it renames into place. Kill tests SIGKILL
one rank right before or after its k-th rename (a shard, a chunk record, the index or the manifest); the driver then kills
the other ranks, as torchrun does, and re-runs the same command. Each result must equal the uninterrupted pack file
for file, manifest included, with no temp file, staging folder or chunk record left.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from _child_run import run_driver  # tests/shards/ is on sys.path (pytest prepends it)
from PIL import Image

from pytorchtricks.core import PttError
from pytorchtricks.shards.chunked import chunk_items
from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.stream import ShardStream
from pytorchtricks.shards.writer import pack

N = 48  # 47 images and one file that does not decode (a reject: a gap in the keys)

DRIVER = r"""
import json, os, signal, sys, warnings
import torch.distributed as dist
from pytorchtricks.shards.writer import pack

a = json.loads(sys.argv[1])
warnings.simplefilter("ignore")

def rank_main(run, rank, store):
    seen = [0]
    log = open(f"{run['log']}-rank{rank}.jsonl", "a")
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        seen[0] += 1
        if run.get("kill") == [rank, seen[0], "before"]:  # the temp file written, not yet renamed
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(src, dst, *args, **kwargs)
        name = os.path.relpath(os.fspath(dst), run["dst"])
        log.write(json.dumps({"name": name, "bytes": os.path.getsize(dst)}) + "\n")
        log.flush()
        if run.get("kill") == [rank, seen[0], "after"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    os.replace = replace
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=run["world"])
    s = pack(a["src"], run["dst"], format=a["fmt"], shard_size=a["shard_size"], workers=0, distributed=True,
             resize=a.get("resize"))
    print(json.dumps({"rank": rank, "events": seen[0], "stats": s["rank_stats"]}), flush=True)

def launch(run, tag):
    store = f"{run['dst']}.store-{tag}"
    pids = []
    for rank in range(run["world"]):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                rank_main(run, rank, store)
            except BaseException as exc:
                print(repr(exc), file=sys.stderr, flush=True)
                code = 3
            os._exit(code)
        pids.append(pid)
    killed, codes = False, {}
    while len(codes) < len(pids):
        pid, status = os.wait()
        codes[pid] = status
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and not killed:
            killed = True  # as torchrun does when a rank dies: stop the others
            for other in pids:
                if other not in codes:
                    try:
                        os.kill(other, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    ok = all(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in codes.values())
    return {"killed": killed, "ok": ok}

out = []
for k, run in enumerate(a["runs"]):
    first = launch(run, f"{k}a")
    again = None
    if run.get("kill"):
        again = launch({**run, "kill": None, "world": run.get("resume_world", run["world"])}, f"{k}b")
    out.append({"first": first, "again": again})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dist-src")
    for i in range(N - 1):
        (root / f"c{i % 3}").mkdir(exist_ok=True)
        px = np.random.default_rng(i).integers(0, 256, (20, 20, 3), dtype=np.uint8)
        px[..., 0] = 5 * i  # the id, read back below
        Image.fromarray(px).save(root / f"c{i % 3}" / f"{i:02d}.png")
    (root / "c1" / "zz-broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    return root


def _drive(src: Path, fmt: str, runs: list[dict], resize: int | None = None) -> list[dict]:
    arg = {"src": str(src), "fmt": fmt, "shard_size": "4000", "runs": runs, "resize": resize}
    return list(run_driver(DRIVER, arg, OMP_NUM_THREADS="1"))


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _who(log: str, world: int) -> dict[int, list[dict]]:
    out = {}
    for r in range(world):
        p = Path(f"{log}-rank{r}.jsonl")
        out[r] = [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
    return out


@pytest.fixture(scope="module")
def runs(src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ptt at world sizes 3, 2 and 1 and again at 3; tar at 3."""
    base = tmp_path_factory.mktemp("dist-runs")
    plan = [("ptt", "w3", 3), ("ptt", "w2", 2), ("ptt", "w1", 1), ("ptt", "w3-again", 3)]
    got = _drive(src, "ptt", [{"dst": str(base / d), "log": str(base / d), "world": w} for _, d, w in plan])
    assert all(r["first"]["ok"] for r in got)
    tar = _drive(src, "tar", [{"dst": str(base / "tar-w3"), "log": str(base / "tar-w3"), "world": 3}])
    assert tar[0]["first"]["ok"]
    return {d: base / d for _, d, _ in plan} | {"tar-w3": base / "tar-w3"}


def test_every_rank_writes_its_own_chunks_and_rank_0_only_merges(runs):
    dst = runs["w3"]
    manifest = json.loads((dst / "manifest.json").read_text())
    size = chunk_items(N)
    who = _who(str(dst), 3)
    wrote = {r: [e["name"] for e in who[r] if e["name"].startswith("shard-")] for r in who}
    for r in range(3):  # each shard by the owner of its chunk (chunk c % world), and by no one else
        assert wrote[r] and all(int(name[6:12]) % 3 == r for name in wrote[r]), wrote
    assert sorted(n for r in wrote for n in wrote[r]) == sorted(s["name"] for s in manifest["shards"])
    # rank 0 writes its own chunks, the index and the manifest; no other rank's shard passes through it
    assert [e["name"] for e in who[0] if not e["name"].startswith(("shard-", ".pack-chunks-"))] == [
        "index.npy",
        "manifest.json",
    ]
    shard_bytes = {r: sum(e["bytes"] for e in who[r] if e["name"].startswith("shard-")) for r in who}
    assert shard_bytes[0] <= sum(shard_bytes.values()) / 3 * 1.5  # its share, not the funnel
    assert manifest["chunk_items"] == size and manifest["options"]["layout"] == "chunks"
    assert manifest["count"] == N - 1 and [r["path"] for r in manifest["rejects"]] == ["c1/zz-broken.png"]
    assert not [p for p in dst.rglob("*") if ".tmp" in p.name or ".pack-" in str(p)]


def test_the_pack_is_byte_identical_at_any_world_size_and_on_a_rerun(runs):
    ref = _tree(runs["w3"])
    assert ref and "index.npy" in ref
    for other in ("w2", "w1", "w3-again"):
        assert _tree(runs[other]) == ref, other


def test_readers_see_every_sample_once_in_the_permuted_order(runs, src):
    ids = sorted(int(x[0][0, 0, 0]) // 5 for x in ShardDataset(runs["w3"]))
    assert ids == list(range(N - 1))
    stream = ShardStream(str(runs["tar-w3"]), shuffle=False, decode="auto")
    got = [(int(img[0, 0, 0]) // 5, extras["__key__"]) for img, _, extras in stream]
    assert sorted(i for i, _ in got) == list(range(N - 1))
    keys = [int(k) for _, k in got]
    assert keys == sorted(keys) and len(set(keys)) == len(
        keys
    )  # unique, increasing; a gap where the reject was
    from pytorchtricks.shards.inspect import inspect_shards

    assert inspect_shards(str(runs["tar-w3"]))["problems"] == []
    assert inspect_shards(str(runs["w3"]))["problems"] == []


def test_lmdb_and_a_missing_launcher_are_refused_with_the_fix(src, tmp_path, monkeypatch):
    with pytest.raises(PttError, match="one database"):
        pack(src, tmp_path / "l", format="lmdb", distributed=True, workers=0)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(PttError, match="torchrun"):
        pack(src, tmp_path / "p", distributed=True, workers=0)


def _events(runs: dict[str, Path]) -> dict[int, int]:
    """Renames each rank made in the uninterrupted world-size-3 run (its kill points)."""
    return {r: len(e) for r, e in _who(str(runs["w3"]), 3).items()}


@pytest.mark.slow  # about 20 three-rank runs
def test_kill_any_rank_after_any_rename_and_rerun_gives_the_same_pack(runs, src, tmp_path):
    events = _events(runs)
    assert events[0] >= 6 and min(events.values()) >= 4
    points = [(r, k, "after") for r in range(3) for k in range(1, events[r] + 1)]
    points += [(0, 1, "before"), (0, events[0], "before"), (2, 1, "before")]  # temp files left behind
    plan = [
        {
            "dst": str(tmp_path / f"k{r}-{k}-{when}"),
            "log": str(tmp_path / f"k{r}-{k}-{when}"),
            "world": 3,
            "kill": [r, k, when],
            "resume_world": 2 if k % 2 else 3,  # resumed at another world size too
        }
        for r, k, when in points
    ]
    got = _drive(src, "ptt", plan)
    ref = _tree(runs["w3"])
    for (r, k, when), res in zip(points, got, strict=True):
        assert res["first"]["killed"], f"rank {r} never reached rename {k}"
        assert res["again"]["ok"], f"the re-run after killing rank {r} {when} rename {k} failed"
        assert _tree(tmp_path / f"k{r}-{k}-{when}") == ref, (
            f"killed rank {r} {when} rename {k}: the re-run differs"
        )


def test_a_bucket_gets_each_shard_as_it_is_finished_never_the_whole_pack_staged(
    runs, src, tmp_path, monkeypatch
):
    import fsspec
    import torch.distributed as dist

    from pytorchtricks.shards import chunked

    staged: list[int] = []  # files in the staging folder at each PUT
    real = chunked.Target.commit

    def commit(self, name):
        staged.append(sum(len(files) for _, _, files in os.walk(self.staging)))
        return real(self, name)

    monkeypatch.setattr(chunked.Target, "commit", commit)
    url = "memory://ptt-dist-test/pack"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        pack(src, url, shard_size="4000", workers=0, distributed=True, staging_dir=tmp_path / "staging")
    finally:
        dist.destroy_process_group()
    fs = fsspec.filesystem("memory")
    got = {
        p.rsplit("/", 1)[-1]: hashlib.sha256(fs.cat_file(p)).hexdigest()
        for p in fs.find("/ptt-dist-test/pack")
    }
    assert got == _tree(runs["w3"])  # the local pack's bytes; no chunk record left in the bucket
    assert staged and max(staged) == 1  # one object staged at a time
    assert not (tmp_path / "staging").exists() or not any((tmp_path / "staging").rglob("*.*"))
    fs.rm("/ptt-dist-test", recursive=True)


def test_a_detection_root_packs_distributed_with_its_boxes_scaled(tmp_path):
    """A COCO root packed by 2 ranks with --resize: the same samples, bytes and targets (boxes scaled to the stored
    size) in the same order as the single-process pack, and the same detection summary in the manifest."""
    root = tmp_path / "coco"
    (root / "train").mkdir(parents=True)
    (root / "annotations").mkdir()
    images, anns = [], []
    for i in range(N - 1):
        w, h = (48, 32) if i % 2 else (32, 48)
        px = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(px).save(root / "train" / f"{i:02d}.jpg", quality=90)
        images.append({"id": i, "file_name": f"{i:02d}.jpg", "width": w, "height": h})
        anns.append({"id": i + 1, "image_id": i, "category_id": 1 + i % 2, "iscrowd": 0,
                     "bbox": [2.0, 4.0, w / 2, h / 3], "area": w * h / 6})  # fmt: skip
    doc = {
        "images": images,
        "annotations": anns,
        "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
    }
    (root / "annotations" / "instances_train.json").write_text(json.dumps(doc))
    one, two = tmp_path / "single", tmp_path / "w2"
    pack(str(root), str(one), shard_size="4000", workers=0, resize=16)
    got = _drive(root, "ptt", [{"dst": str(two), "log": str(two), "world": 2}], resize=16)
    assert got[0]["first"]["ok"]
    a, b = ShardDataset(str(one), decode=None), ShardDataset(str(two), decode=None)
    assert len(a) == len(b) == N - 1
    for i in range(len(a)):
        (pa, la, ea), (pb, lb, eb) = a.read_raw(i), b.read_raw(i)
        assert pa == pb and la == lb and ea == eb
        t = ea["target"]
        assert min(t["size"]) == 16 and max(t["size"]) == 24  # stored at the short side 16, boxes with it
        assert t["boxes"][0][2] <= t["size"][1] and t["boxes"][0][3] <= t["size"][0]
    ma = json.loads((one / "manifest.json").read_text())
    mb = json.loads((two / "manifest.json").read_text())
    assert ma["detection"] == mb["detection"] and mb["detection"]
