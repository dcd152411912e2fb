"""doctor_data: stage times sum to the measured total within 10%; verdicts follow the simulated step time."""

from __future__ import annotations

import pytest
import torch

from pytorchtricks.analysis.data_doctor import STAGES, doctor_data, open_image_dataset
from pytorchtricks.cli import main
from pytorchtricks.core import PttError
from pytorchtricks.tricks.data.make_loader import _photo_bytes


@pytest.fixture(scope="module")
def jpegs() -> list[tuple[bytes, int]]:
    return _photo_bytes(40, (120, 160))


def test_stage_times_sum_to_the_measured_total(jpegs):
    # another process preempting this one between two stage clocks adds to the outer clock only: of 3 runs, the
    # closest says how much of the loop the stages account for (a few ms batches: one time slice is ~20%)
    runs = [doctor_data(jpegs, batch_size=8, crop=64, batches=3, num_workers=0) for _ in range(3)]
    r = min(runs, key=lambda x: abs(x.stage_sum_s - x.total_s) / x.total_s)
    assert set(r.stages_s) == set(STAGES)
    assert all(v >= 0 for v in r.stages_s.values()) and r.stages_s["decode"] > 0
    assert abs(r.stage_sum_s - r.total_s) <= 0.10 * r.total_s, (r.stages_s, r.total_s)
    assert r.verdict.startswith("unknown") and r.fix  # no step time given: no verdict, still a first fix


def test_verdict_follows_the_step_time(jpegs):
    slow_step = doctor_data(jpegs, batch_size=8, crop=64, batches=2, num_workers=1, step_time_s=0.5)
    assert slow_step.verdict.startswith("compute-bound"), slow_step.verdict
    no_step = doctor_data(jpegs, batch_size=8, crop=64, batches=2, num_workers=0, step_time_s=0.0)
    assert no_step.verdict.startswith("input-bound") and no_step.wait_s and no_step.wait_s > 0
    assert no_step.fix  # names a fix from the slowest stage


def test_misuse_and_paths(tmp_path):
    with pytest.raises(PttError, match="at least"):
        doctor_data([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)] * 3, batch_size=4)
    with pytest.raises(PttError, match="does not exist"):
        open_image_dataset(tmp_path / "nope")
    with pytest.raises(PttError, match="unknown option 'step_time': did you mean 'step_time_s'"):
        doctor_data([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)] * 3, step_time=0.1)


def test_a_config_is_its_keywords_as_one_value(jpegs):
    from pytorchtricks.analysis.data_doctor import DataDoctorConfig

    opts = {"batch_size": 8, "crop": 64, "batches": 2, "num_workers": 0, "step_time_s": 0.0}
    by_cfg = doctor_data(jpegs, DataDoctorConfig(**opts))
    assert (by_cfg.batch_size, by_cfg.batches, by_cfg.num_workers, by_cfg.step_time_s) == (8, 2, 0, 0.0)
    assert by_cfg.verdict.startswith("input-bound")  # the step takes no time: the loader is all the wait
    with pytest.raises(PttError, match=r"not both \(got batches too\)"):
        doctor_data(jpegs, DataDoctorConfig(**opts), batches=3)


def test_cli_prints_the_stage_table_and_verdict(tmp_path, capsys, jpegs):
    for i, (raw, label) in enumerate(jpegs):
        d = tmp_path / f"class{label % 2}"
        d.mkdir(exist_ok=True)
        (d / f"{i}.jpg").write_bytes(raw)
    rc = main(
        [
            "doctor",
            "data",
            str(tmp_path),
            "--batch-size",
            "8",
            "--batches",
            "2",
            "--crop",
            "64",
            "--workers",
            "0",
            "--step-time",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for word in (
        "read",
        "decode",
        "augment",
        "collate",
        "host_to_device",
        "wait",
        "input-bound",
        "decoded megapixels",
        "loader alone: its workers used",  # the CPU-seconds accounting
        "CPU per step: training process",
    ):
        assert word in out
    assert main(["doctor", "data", str(tmp_path / "missing")]) == 2


class _SlowSamples(torch.utils.data.Dataset):
    """Each sample takes 5 ms to produce: a loader with one worker cannot beat 20 ms per batch of 4."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        import time

        time.sleep(0.005)
        return torch.zeros(3, 40, 40, dtype=torch.uint8), i % 2


def test_loader_rate_is_not_inflated_by_the_prefetched_queue():
    # the worker queues batches ahead while the first one is taken; timing those would report a free loader
    r = doctor_data(_SlowSamples(), batch_size=4, crop=32, batches=2, num_workers=1, step_time_s=None)
    assert r.loader_batch_s >= 0.5 * 4 * 0.005, r.loader_batch_s


def test_a_ptt_pack_folder_is_opened_as_shards(tmp_path, jpegs):
    import pytorchtricks as ptt
    from pytorchtricks.shards.dataset import ShardDataset

    src = tmp_path / "photos"
    for i, (raw, label) in enumerate(jpegs):
        (src / f"class{label % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"class{label % 2}" / f"{i}.jpg").write_bytes(raw)
    ptt.pack(str(src), str(tmp_path / "packed"), workers=0)
    assert isinstance(open_image_dataset(tmp_path / "packed"), ShardDataset)
    r = doctor_data(tmp_path / "packed", batch_size=8, crop=64, batches=2, num_workers=0)
    assert r.stages_s["decode"] > 0
    ptt.pack(str(src), str(tmp_path / "tar"), format="tar", workers=0)
    with pytest.raises(PttError, match=r"tar pack, read in order.*--format ptt"):
        open_image_dataset(tmp_path / "tar")


def _jpeg(arr, progressive: bool = False) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90, progressive=progressive)
    return buf.getvalue()


def test_decoded_megapixels_and_fallbacks_are_reported(jpegs):
    """The stage table's decoded megapixels per sample: below the whole images' when crops decode as windows;
    progressive files fall back, counted by reason, with a note that says how to fix them."""
    import numpy as np

    from pytorchtricks.data.decode import backend_works, decode_image

    if not backend_works("roi"):
        pytest.skip("the region-of-interest decode does not build here")
    big = decode_image(jpegs[0][0], size=(480, 640))  # 0.31 MP each
    data = [(_jpeg(np.ascontiguousarray(np.roll(big, k, axis=1))), k % 2) for k in range(12)]
    r = doctor_data(data, batch_size=4, crop=64, batches=1, num_workers=0)
    assert r.decoded_mp_per_sample is not None and 0 < r.decoded_mp_per_sample < 0.307
    assert r.window_decodes == 4 and r.decode_fallbacks == {}
    assert not any("decoded whole" in n for n in r.notes)
    prog = [(_jpeg(big, progressive=True), k % 2) for k in range(12)]
    r = doctor_data(prog, batch_size=4, crop=64, batches=1, num_workers=0)
    assert r.window_decodes == 0 and r.decode_fallbacks == {"progressive": 4}
    assert any("4 of 4 JPEGs were decoded whole" in n and "progressive: 4" in n for n in r.notes)
