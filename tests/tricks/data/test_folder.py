"""JpegFolder and split_folders: an ImageNet-style root (ROOT/train + ROOT/val) is refused, not read as two classes."""

from __future__ import annotations

from pathlib import Path

import pytest

import pytorchtricks as ptt
from pytorchtricks.core import PttError
from pytorchtricks.data.folder import JpegFolder, split_folders


def _tree(root: Path, files: list[str]) -> Path:
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(b"\xff\xd8 not decoded here")
    return root


IMAGENET = ["train/cat/1.jpg", "train/cat/2.jpg", "train/dog/3.JPEG", "val/cat/4.jpg", "val/dog/5.jpg"]


def test_imagenet_style_root_gives_its_splits(tmp_path):
    root = _tree(tmp_path, IMAGENET)
    assert split_folders(root) == {"train": str(root / "train"), "val": str(root / "val")}
    assert ptt.split_folders is split_folders
    train = JpegFolder(split_folders(root)["train"])
    assert train.classes == ["cat", "dog"] and len(train) == 3 and train.labels.tolist() == [0, 0, 1]


def test_jpeg_folder_refuses_a_split_root_and_names_the_fix(tmp_path):
    root = _tree(tmp_path, IMAGENET)
    with pytest.raises(PttError, match="splits") as exc:
        JpegFolder(root)
    msg = str(exc.value)
    assert (
        f"JpegFolder({str(root / 'train')!r})" in msg and str(root / "val") in msg and "split_folders" in msg
    )


@pytest.mark.parametrize(
    ("names", "want"),
    [
        (["train/a/1.jpg", "validation/a/2.jpg"], {"train": "train", "val": "validation"}),
        (["Train/a/1.jpg", "Valid/a/2.jpg"], {"train": "Train", "val": "Valid"}),
        (
            ["train/a/1.jpg", "test/2.jpg"],
            {"train": "train", "test": "test"},
        ),  # an unlabelled, flat test split
        (["train/a/1.jpg", "val/a/2.jpg", "test/a/3.jpg"], {"train": "train", "val": "val", "test": "test"}),
    ],
)
def test_split_names(tmp_path, names, want):
    root = _tree(tmp_path, names)
    assert split_folders(root) == {k: str(root / v) for k, v in want.items()}


@pytest.mark.parametrize(
    "names",
    [
        ["cat/1.jpg", "dog/2.jpg"],  # a class tree
        ["train/a/1.jpg", "cat/2.jpg"],  # "train" without a second split: one class among others
        ["train/1.jpg", "test/2.jpg"],  # classes that happen to be called train and test (no class folders)
    ],
)
def test_class_trees_are_not_split_roots(tmp_path, names):
    root = _tree(tmp_path, names)
    assert split_folders(root) == {}
    assert len(JpegFolder(root).classes) == 2


def test_missing_root(tmp_path):
    assert split_folders(tmp_path / "nope") == {}
    with pytest.raises(PttError, match="not a folder"):
        JpegFolder(tmp_path / "nope")
