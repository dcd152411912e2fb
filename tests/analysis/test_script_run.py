"""`ptt doctor run -- python train.py`: the unmodified script, timed per step, its objects captured."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytorchtricks.analysis.script_run import STAGES, run_script
from pytorchtricks.cli import main
from pytorchtricks.core import PttError

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def photos(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(2):
        (tmp_path / "photos" / f"c{k}").mkdir(parents=True)
        for j in range(12):
            img = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
            Image.fromarray(img).save(tmp_path / "photos" / f"c{k}" / f"{j}.jpg")
    return str(tmp_path / "photos")


def test_run_splits_the_steps_and_captures_the_scripts_objects(photos, monkeypatch, tmp_path):
    import torch

    monkeypatch.chdir(tmp_path)
    script = str(SCRIPTS / "train_planted.py")
    before = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.random.get_rng_state(),
    )
    r = run_script(["python", script, photos, "-j", "0", "--steps", "50"], steps=3, warmup=1)
    # the script set cudnn.benchmark/deterministic and seeded torch: the process gets its own state back
    after = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.random.get_rng_state())
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])
    assert r.ended.startswith("stopped after 4 optimizer steps") and len(r.steps) == 3
    for st in r.steps:  # the stages partition the step (other = what no hook saw)
        assert set(st) == {*STAGES, "step"} and all(v >= 0 for v in st.values())
        assert sum(st[s] for s in STAGES) == pytest.approx(st["step"], rel=0.05)
    train = r.loaders[0]
    assert train["via"] == "DataLoader" and train["dataset"] == "ImageFolder" and train["samples"] == 24
    assert train["batch_size"] == 8 and train["transform_settings"]["crop"] == [32, 32]
    assert train["num_workers"] == 0 and train["pin_memory"] is True
    assert r.model["class"] == "ResNet" and r.model["params"] > 1e6
    assert r.optimizer == {
        "class": "SGD",
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "nesterov": False,
        "param_groups": [{"params": 62, "lr": 0.1, "weight_decay": 1e-4}],
    }
    # where the script builds what advice changes: the lines of train_planted.py
    lines = {k: (os.path.basename(v["file"]), v["line"]) for k, v in r.sites.items()}
    assert lines["loader"] == ("train_planted.py", 49) and lines["model"] == ("train_planted.py", 53)
    assert lines["optimizer"] == ("train_planted.py", 60) and lines["backward"] == ("train_planted.py", 73)
    assert r.sites["optimizer"]["code"].startswith("optimizer = torch.optim.SGD(")
    assert r.lint and all(f["id"].startswith("PTL") for f in r.lint)  # ptt lint ran on the model, real shape
    where = dict(r.syncs)
    assert where.get("train_planted.py:76 .item()") == 1.0 and where.get("train_planted.py:77 .item()") == 1.0
    assert (
        r.verdict in ("input-bound", "compute-bound", "optimizer-bound")
        and "data wait" in r.evidence
        and r.fix
    )


def _losses(cmd: list[str], cwd: str) -> tuple[list[str], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert p.returncode == 0, p.stderr[-2000:]
    return re.findall(r"step \d+ loss [0-9.]+", p.stdout), p.stdout


@pytest.mark.slow
def test_the_doctor_changes_nothing_but_time(photos, tmp_path):
    """The script under the doctor prints the same losses as without it (same seed), and ends on its own."""
    script = str(SCRIPTS / "train_planted.py")
    args = [script, photos, "-j", "0", "--steps", "3"]
    plain, _ = _losses([sys.executable, *args], str(tmp_path))
    ptt = [sys.executable, "-m", "pytorchtricks.cli", "doctor", "run", "--steps", "5", "--warmup", "0", "--out",
           str(tmp_path / "out"), "--", "python", *args]  # fmt: skip
    doctored, out = _losses(ptt, str(tmp_path))
    assert len(plain) == 3 and doctored == plain
    assert "the script ended after 3 optimizer step(s)" in out and "verdict:" in out
    assert (
        "CPU per step: training process" in out and "other programs took" in out
    )  # the CPU-seconds accounting
    rows = [json.loads(x) for x in Path(tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["doctor-run", *["doctor-step"] * 3, "doctor-summary"]
    cs = rows[-1]["core_seconds"]
    assert cs["main_cpu_s_per_step"] > 0 and cs["workers_cpu_s_per_step"] >= 0 and cs["cores"] >= 1
    assert rows[-1]["loaders"][0]["num_workers"] == 0 and rows[0]["env"]["torch"]


def test_bad_commands_are_refused_with_the_fix(tmp_path, capsys):
    with pytest.raises(PttError, match="no such script"):
        run_script(["python", str(tmp_path / "missing.py")])
    with pytest.raises(PttError, match="give the command"):
        run_script(["python"])
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    assert main(["doctor", "run", "--", "python", str(failing)]) != 0
    assert "exited with status 3" in capsys.readouterr().err


@pytest.mark.slow
def test_doctor_run_tune_uses_the_scripts_own_objects(photos, tmp_path, monkeypatch):
    """--tune hands tune the script's model, its optimizer with its hyper-parameters (weight decay kept) and its
    ImageFolder's root; the receipt's apply.py builds that optimizer."""
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "tune")
    script = str(SCRIPTS / "train_planted.py")
    rc = main(["doctor", "run", "--steps", "2", "--warmup", "1", "--tune", "--time-budget", "25", "--tune-out", out,
               "--out", str(tmp_path / "doc"), "--", "python", script, photos, "-j", "0", "--steps", "20"])  # fmt: skip
    assert rc == 0
    receipt = json.loads(Path(out, "receipt.json").read_text())
    wl = receipt["workload"]
    assert wl["model"] == "captured ResNet" and wl["batch_size"] == 8 and wl["input_shape"] == [3, 32, 32]
    assert wl["optimizer"] == [
        "sgd",
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "dampening": 0, "nesterov": False},
    ]
    code = Path(out, "apply.py").read_text()
    assert (
        "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0, weight_decay=0.0001" in code
    )
    script = wl["script"]  # where the script builds its objects: apply.py points there
    assert script["file"] == script_path(script) and script["sites"]["loader"]["line"] == 49
    assert script["root"] == photos and script["transform"]["crop"] == [32, 32]
    if receipt["recommended"]:
        assert f"# In your script, {script['file']}: what to change, and where." in code
    assert Path(tmp_path, "doc", "report.html").read_text().count("train_planted.py:49") == 1


def script_path(script):
    return str((SCRIPTS / "train_planted.py").resolve()) if script else ""


def test_apply_py_says_which_line_of_the_script_each_trick_changes():
    from pytorchtricks.tune import receipt

    def site(line, code):
        return {"file": "/src/train.py", "line": line, "code": code}

    script = {
        "file": "/src/train.py", "root": "/data/photos", "via": "DataLoader",
        "transform": {"mode": "train", "crop": [176, 176], "scale": [0.35, 1.0], "ratio": [0.75, 1.3333],
                      "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
        "sites": {"loader": site(40, "train_loader = torch.utils.data.DataLoader("),
                  "optimizer": site(52, "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-4)"),
                  "model": site(47, "model = models.resnet50()"), "backward": site(66, "loss.backward()")},
    }  # fmt: skip
    payload = {
        "recommended": ["cache_in_ram", "make_loader", "fast_optimizer", "to_channels_last"],
        "workload": {"for": "train", "model": "captured ResNet", "batch_size": 64, "input_size": 176,
                     "input_shape": [3, 176, 176], "num_workers": 2, "script": script,
                     "optimizer": ["sgd", {"lr": 0.1, "weight_decay": 1e-4}]},
        "combined": {"ratio": 3.0, "ratio_q1": 2.9, "ratio_q3": 3.1},
        "env": {"device_name": "cpu", "threads": 2, "torch": "x"}, "candidates": [],
    }  # fmt: skip
    code = receipt.apply_snippet(payload)
    compile(code, "apply.py", "exec")  # still a valid module
    block = code[code.index("# In your script, /src/train.py") : code.index("def apply(")]
    # grouped by the script's line, in the hooks' order; the script's own names and settings kept
    assert block.index("train.py:47  model = models.resnet50()") < block.index("train.py:52  optimizer")
    assert block.index("train.py:52  optimizer") < block.index("train.py:40  train_loader")
    assert "after it (to_channels_last):\n#         ptt.to_channels_last_(model)" in block
    assert "ptt.fast_optimizer(model.parameters(), 'sgd', lr=0.1, weight_decay=0.0001)" in block
    assert "dataset = ptt.JpegFolder('/data/photos')" in block
    assert "train_loader = ptt.make_loader(dataset, 64, crop=176, num_workers=2)" in block
    assert block.index("ptt.JpegFolder") < block.index("ptt.cache_in_ram") < block.index("ptt.make_loader")
    assert "pass scale=(0.35, 1.0) to ptt.make_loader" in block and "ratio=" not in block
    assert "sub_(torch.tensor([123.675, 116.280, 103.530]" in block  # the script's Normalize, in uint8 units
    payload["workload"].pop("script")
    assert "# In your script" not in receipt.apply_snippet(payload)


def test_run_as_a_module_and_its_helper_files_count(tmp_path, monkeypatch):
    """`-- python -m pkg.train`: run as python -m runs it; a host sync in the package's other file is found."""
    pkg = tmp_path / "proj" / "trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "meters.py").write_text("def log(loss):\n    return loss.item()\n", encoding="utf-8")
    (pkg / "train.py").write_text(
        "import sys\nimport torch\nfrom trainer.meters import log\n"
        "model = torch.nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))\n"
        "loader = torch.utils.data.DataLoader(data, batch_size=int(sys.argv[1]))\n"
        "for x, y in loader:\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    log(loss)\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.syspath_prepend(str(tmp_path / "proj"))
    r = run_script(["python", "-m", "trainer.train", "5"], steps=3, warmup=1)
    assert r.ended.startswith("stopped after 4") and len(r.steps) == 3
    assert r.script == str(pkg / "train.py") and r.loaders[0]["batch_size"] == 5
    assert (
        r.sites["loader"]["line"] == 7
        and r.sites["optimizer"]["line"] == 5
        and r.sites["backward"]["line"] == 11
    )
    assert dict(r.syncs) == {"meters.py:2 .item()": 1.0}
    with pytest.raises(PttError, match=r"no module named 'trainer\.nope'"):
        run_script(["python", "-m", "trainer.nope"])


def test_the_doctor_finds_the_lines_that_made_the_loaders_dataset_and_sampler(tmp_path, monkeypatch):
    """The DataLoader's dataset and batch sampler, passed by name: the lines that assigned those names in the
    function that builds the loader (of an if / else, the branch naming the sampler's class; of a name assigned
    twice, the one naming its class)."""
    (tmp_path / "train.py").write_text(
        "import sys\nimport torch\n\n\n"
        "class Flip:\n    def __call__(self, x):\n        return x\n\n\n"
        "class Pair:\n    def __init__(self, ts):\n        self.transforms = ts\n\n\n"
        "class Data(torch.utils.data.TensorDataset):\n    pass\n\n\n"
        "def main(grouped):\n"
        "    model = torch.nn.Linear(4, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    dataset = None\n"
        "    dataset = Data(torch.randn(40, 4), torch.randint(0, 2, (40,)))\n"  # line 23
        "    dataset.note = 'no policy'\n"
        "    base = torch.utils.data.RandomSampler(dataset)\n"
        "    if grouped:\n"
        "        batches = torch.utils.data.BatchSampler(base, 4, drop_last=True)\n"  # line 27
        "    else:\n"
        "        batches = [[0, 1]]\n"
        "    loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches)\n"  # line 30
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n\n\n"
        "main(True)\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    r = run_script(["python", "train.py"], steps=2, warmup=1)
    lines = {k: (os.path.basename(v["file"]), v["line"]) for k, v in r.sites.items()}
    assert lines["loader"] == ("train.py", 30)
    assert lines["dataset"] == ("train.py", 23) and r.sites["dataset"]["code"].startswith("dataset = Data(")
    assert lines["sampler"] == ("train.py", 27) and "BatchSampler(base, 4" in r.sites["sampler"]["code"]


def test_the_detection_policy_is_named_as_the_reference_names_it():
    import torch
    from torchvision.transforms import v2 as T

    from pytorchtricks.analysis.step_split import detection_policy

    flip = T.Compose([T.RandomHorizontalFlip(0.5), T.Compose([T.PILToTensor(), T.ToDtype(torch.float)])])
    assert detection_policy(flip) == (
        "hflip: full-size images, resized by the detector's own transform "
        "(RandomHorizontalFlip, PILToTensor, ToDtype)"
    )
    multi = T.Compose([T.RandomShortestSize((480, 800), 1333), T.RandomHorizontalFlip()])
    assert detection_policy(multi).startswith("multiscale (RandomShortestSize, RandomHorizontalFlip)")
    ssd = T.Compose(
        [T.RandomPhotometricDistort(), T.RandomZoomOut(), T.RandomIoUCrop(), T.RandomHorizontalFlip()]
    )
    assert detection_policy(ssd).startswith("ssd (") and detection_policy(T.RandomIoUCrop()).startswith(
        "ssdlite"
    )
    assert detection_policy(T.Compose([T.Resize(512)])).startswith("custom (Resize)")
    assert detection_policy(None) is None


def test_apply_py_names_the_detection_scripts_dataset_loader_and_sampler_lines():
    from pytorchtricks.tune import receipt

    def site(file, line, code):
        return {"file": file, "line": line, "code": code}

    script = {
        "file": "/ref/train.py", "root": "/coco/train2017", "via": "DataLoader",
        "annotations": "/coco/annotations/instances_train2017.json",
        "sites": {"loader": site("/ref/train.py", 230, "data_loader = torch.utils.data.DataLoader("),
                  "dataset": site("/ref/train.py", 205, "dataset, num_classes = get_dataset(is_train=True, args=args)"),
                  "sampler": site("/ref/train.py", 222, "train_batch_sampler = GroupedBatchSampler(train_sampler, "
                                  "group_ids, args.batch_size)")},
    }  # fmt: skip
    payload = {
        "recommended": ["pack", "make_loader"],
        "workload": {"for": "train", "model": "captured FasterRCNN", "batch_size": 4, "input_size": 320,
                     "input_shape": [3, 320, 320], "num_workers": 2, "script": script, "task": "detection",
                     "max_size": 640, "source": "/coco/annotations/instances_train2017.json",
                     "optimizer": ["sgd", {"lr": 0.02}]},
        "combined": {"ratio": 3.0, "ratio_q1": 2.9, "ratio_q3": 3.1},
        "env": {"device_name": "cpu", "threads": 2, "torch": "x"}, "candidates": [],
    }  # fmt: skip
    code = receipt.apply_snippet(payload)
    compile(code, "apply.py", "exec")
    block = code[code.index("# In your script, /ref/train.py") : code.index("def apply(")]
    assert block.index("train.py:230  data_loader = ") < block.index("train.py:205  dataset, num_classes = ")
    assert block.index("train.py:205") < block.index(
        "train.py:222  train_batch_sampler = GroupedBatchSampler("
    )
    assert (
        "data_loader = ptt.make_detection_loader(dataset, 4, ptt.DetectionRecipe.shortest_side(320, 640)"
        in block
    )
    assert (
        "dataset = ptt.open_detection('/coco/annotations/instances_train2017.json', images='/coco/train2017')"
        in block
    )  # the annotation file the script's CocoDetection was built from, as the doctor saw it
    after_dataset = block[block.index("train.py:205") :]
    assert "what ptt.open_detection replaces above" in after_dataset
    assert "drop it (and the aspect-ratio groups computed for it)" in block[block.index("train.py:222") :]


def test_compare_says_what_changed_between_two_runs(tmp_path):
    from pytorchtricks.analysis.script_run import RunReport, compare_runs, write_run

    loader = {"dataset": "ImageFolder", "batch_size": 8, "num_workers": 0, "pin_memory": True}
    slow = RunReport(["python", "t.py"], steps=[{"data wait": 0.6, "forward": 0.1, "backward": 0.2, "optimizer": 0.05,
                                                "other": 0.05, "step": 1.0}], loaders=[loader], verdict="input-bound")  # fmt: skip
    before = write_run(slow, str(tmp_path / "a"))
    fast = RunReport(["python", "t.py"], steps=[{"data wait": 0.01, "forward": 0.1, "backward": 0.2, "optimizer": 0.05,
                                                "other": 0.04, "step": 0.4}], loaders=[{**loader, "num_workers": 2}],
                     verdict="compute-bound")  # fmt: skip
    lines = compare_runs(before, fast)
    assert lines[0] == "step 1000 -> 400 ms (2.50x the speed)"
    assert "data wait: 60% -> 2% of the step (600 -> 10 ms)" in lines
    assert "loader num_workers: 0 -> 2" in lines and "verdict: input-bound -> compute-bound" in lines
    assert compare_runs(before, slow) == [
        "step 1000 -> 1000 ms (1.00x the speed)",
    ]
    with pytest.raises(PttError, match="no such file"):
        compare_runs(str(tmp_path / "none.jsonl"), fast)
    (tmp_path / "other.jsonl").write_text('{"kind": "tune-run"}\n', encoding="utf-8")
    with pytest.raises(PttError, match=r"not a `ptt doctor run` results\.jsonl"):
        compare_runs(str(tmp_path / "other.jsonl"), fast)
    page = (tmp_path / "a" / "report.html").read_text()
    assert "Verdict: input-bound" in page and "ImageFolder" in page and "<svg" in page


def test_write_run_puts_the_first_batch_in_the_row_the_page_shows(tmp_path):
    """The page (report/, below the jobs) renders the text the row holds; it computes nothing of analysis' own."""

    from pytorchtricks.analysis.script_run import RunReport, write_run

    run = RunReport(["python", "t.py"], steps=[{"data wait": 0.1, "forward": 0.1, "backward": 0.2, "optimizer": 0.05,
                                               "other": 0.05, "step": 0.5}], verdict="compute-bound",
                    model={"class": "TinyNet", "params": 2_000_000}, input_shape=[8, 3, 32, 48])  # fmt: skip
    rows = [json.loads(x) for x in Path(write_run(run, str(tmp_path))).read_text().splitlines()]
    summary = next(r for r in rows if r["kind"] == "doctor-summary")
    assert summary["first_batch"] == run.first_batch() == "8x3x32x48"
    page = (tmp_path / "report.html").read_text()
    assert "model TinyNet (2.0 M params), first batch 8x3x32x48" in page


@pytest.mark.slow
def test_the_fix_in_place_says_what_changed(photos, tmp_path, monkeypatch, capsys):
    """-j 0 with a DataLoader, then -j 2 with ptt.make_loader in place (the clean script's --loader ptt):
    the second run names make_loader and says what changed since the first."""
    monkeypatch.chdir(tmp_path)
    base = ["doctor", "run", "--steps", "3", "--warmup", "1"]
    planted = ["python", str(SCRIPTS / "train_planted.py"), photos, "-j", "0", "--steps", "20"]
    assert main([*base, "--out", "a", "--", *planted]) == 0
    clean = ["python", str(SCRIPTS / "train_clean.py"), photos, "-j", "2", "--loader", "ptt", "--steps", "20"]
    assert main([*base, "--out", "b", "--compare", "a/results.jsonl", "--", *clean]) == 0
    out = capsys.readouterr().out
    assert (
        "loader at train_clean.py:48: ptt.make_loader over JpegFolder (24 samples), batch 8, num_workers 2"
        in out
    )
    assert "changed since a/results.jsonl: loader via: DataLoader -> ptt.make_loader" in out
    assert "changed since a/results.jsonl: loader num_workers: 0 -> 2" in out
    page = Path("b/report.html").read_text()
    assert "Changed since the earlier run" in page and "earlier run" in page


@pytest.fixture
def coco_root(tmp_path):
    """A COCO root of 6 real photos (Debian wallpapers, downscaled to 160-240 px) with 1-2 boxes each."""
    from PIL import Image

    from pytorchtricks.data.photoset import wallpaper_sources

    src = wallpaper_sources()
    if len(src) < 3:
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    root = tmp_path / "coco"
    (root / "images").mkdir(parents=True)
    images, anns = [], []
    for i in range(6):
        im = Image.open(src[i % len(src)][1]).convert("RGB")
        im.thumbnail((240, 240) if i % 3 else (160, 240))  # landscape and portrait: two aspect groups
        w, h = im.size
        im.save(root / "images" / f"{i}.jpg", quality=90)
        images.append({"id": i, "file_name": f"{i}.jpg", "width": w, "height": h})
        for k in range(1 + i % 2):
            x, y = 10 + 20 * k, 12 + 15 * k
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": 1 + k, "iscrowd": 0,
                         "bbox": [x, y, w / 3, h / 3], "area": w * h / 9})  # fmt: skip
    cats = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    (root / "annotations.json").write_text(
        json.dumps({"images": images, "annotations": anns, "categories": cats})
    )
    return str(root)


@pytest.mark.slow
def test_the_doctor_reads_a_detection_script_of_the_references_shape(coco_root, tmp_path):
    """CocoDetection wrapped for v2 in a Subset, a grouped batch sampler, a detector with a list input and a loss
    dict: the doctor names each of them (not `Subset`, `batch None`, `first batch ?`) and lints the detector."""
    pytest.importorskip("pycocotools")
    script = str(SCRIPTS / "train_detection.py")
    cmd = [sys.executable, "-m", "pytorchtricks.cli", "doctor", "run", "--steps", "2", "--warmup", "1", "--out",
           str(tmp_path / "out"), "--tune", "--time-budget", "25", "--device-step-ms", "60", "--tune-out",
           str(tmp_path / "tune"), "--", "python", script, coco_root, "--steps", "3"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    out = " ".join(p.stdout.split())  # rich wraps long lines
    assert "DataLoader over CocoDetection in the transforms-v2 wrapper in Subset (6 samples)" in out, out
    assert "batch 2 (from its GroupedBatchSampler)" in out
    assert (
        "policy hflip: full-size images, resized by the detector's own transform (RandomHorizontalFlip, "
        in out
    )
    src = Path(script).read_text().splitlines()
    at = {
        k: 1 + next(i for i, x in enumerate(src) if x.strip().startswith(k))
        for k in ("ds = torch.utils", "sampler =")
    }
    assert (
        f"built from its dataset at train_detection.py:{at['ds = torch.utils']}, its sampler at "
        f"train_detection.py:{at['sampler =']}" in out
    ), out
    assert "FasterRCNN" in out and "detection" in out and "a list of 2 image(s) (3x" in out
    assert "returns a dict (loss_classifier, loss_box_reg, loss_objectness, loss_rpn_box_reg)" in out
    assert "ptt lint on the model" in out and "verdict:" in out and "CPU per step" in out
    rows = [json.loads(x) for x in Path(tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    summary = rows[-1]
    assert summary["loaders"][0]["task"] == "detection" and summary["model"]["task"] == "detection"
    assert summary["loaders"][0]["annotations"] == os.path.join(coco_root, "annotations.json")  # what it read
    assert len(summary["input_list"]) == 2 and all(len(s) == 3 for s in summary["input_list"])
    # --tune ran the detection workload on the script's own detector, its CocoDetection's annotations and images
    assert "tune on the script's objects: FasterRCNN" in out and "detection" in out
    run = json.loads(Path(tmp_path / "tune" / "results.jsonl").read_text().splitlines()[0])
    assert run["workload"]["task"] == "detection" and run["workload"]["model"] == "captured FasterRCNN"
    assert run["workload"]["device_step_ms"] == 60 and "6 images" in run["workload"]["data"]


def test_a_trainer_that_builds_its_objects_through_factories_is_read_right(tmp_path, monkeypatch):
    """Its optimizer is the one that steps (3 groups, their lr - not the defaults of a throwaway built and never
    stepped), its model the one whose parameters that updates (not the EMA copy), its first batch a trained
    forward's (not the stride probe under no_grad), its loader the repeating DataLoader subclass whose batches reach
    the model (not the validation one); a step is one batch where the loop accumulates gradients."""
    monkeypatch.chdir(tmp_path)
    # 8 batches an epoch: the 9th step is the second epoch's first, after the validation loader ran
    r = run_script(["python", str(SCRIPTS / "train_factory.py"), "--epochs", "3"], steps=8, warmup=1)
    assert r.ended.startswith("stopped after 9 steps of one batch (4 optimizer step(s)")
    assert len(r.steps) == 8
    opt = r.optimizer
    assert opt["class"] == "AdamW" and opt["lr"] == 0.001429
    assert opt["weight_decay"] == [0.0005, 0.0, 0.0] and [g["params"] for g in opt["param_groups"]] == [
        3,
        1,
        4,
    ]
    assert r.sites["optimizer"]["code"].startswith("return torch.optim.AdamW(")
    assert r.model["class"] == "Detector" and r.input_shape == [4, 3, 64, 64]
    assert r.captured["model"] is not None and r.captured["model"].training  # the trained one, not the EMA
    train = r.loaders[0]
    assert train["class"] == "RepeatingLoader" and train["batch_size"] == 4 and train["num_workers"] == 0
    assert train["samples"] == 32 and [x["samples"] for x in r.loaders] == [32, 8]
    assert r.lint and all(f["id"].startswith("PTL") for f in r.lint)  # lint ran at the real batch's shape
    assert r.verdict != "unknown" and r.fix and f"over {len(r.steps)} steps" in r.evidence


def test_a_console_script_runs_its_entry_point_in_process(tmp_path, monkeypatch):
    """A command on PATH that is a console script of an installed package runs its entry point here (its steps
    timed, its package's files the user's); a command that is not Python is refused with what to run instead."""
    import shutil

    pkg = tmp_path / "site" / "factorytrain"
    pkg.mkdir(parents=True)
    shutil.copy(SCRIPTS / "train_factory.py", pkg / "trainer.py")
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("def main():\n    from factorytrain.trainer import main\n\n    main()\n")
    info = tmp_path / "site" / "factorytrain-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: factorytrain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nfactorytrain = factorytrain.cli:main\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.chdir(tmp_path)
    r = run_script(["factorytrain", "--epochs", "3"], steps=3, warmup=1)
    assert len(r.steps) >= 3 and r.optimizer["class"] == "AdamW" and r.model["class"] == "Detector"
    assert r.sites["optimizer"]["file"] == str(pkg / "trainer.py")
    with pytest.raises(PttError, match="cannot run it in its own process"):
        run_script(["ls", "-l"])
    with pytest.raises(PttError, match="no command of that name on PATH"):
        run_script(["no-such-ptt-command-47"])
