"""A trainer that builds its objects through its own factories, in the shape of Ultralytics' (written for this
project's tests; no line of Ultralytics): the model runs a 1x3x32x32 stride probe under no_grad when built, a
throwaway AdamW is made and never stepped, the loader is a DataLoader subclass that wraps its batch sampler in a
repeating sampler and overrides ``__iter__``, the model is called on the batch dict (its image made float), the
optimizer is AdamW with 3 parameter groups whose lr is set per group (the constructor's defaults unused), gradients
are accumulated over 2 batches, an EMA copy and a validation loader run under no_grad at each epoch's end.

    python train_factory.py --epochs 2
"""

import argparse
import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

LR = 0.001429  # what the trainer's rule gives; AdamW's default is 0.001


class Boxes(Dataset):
    """Synthetic uint8 images with a target, as a detection dataset hands them to its collate."""

    def __init__(self, n: int, size: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.img = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.cls = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.img)

    def __getitem__(self, i: int) -> dict:
        return {"img": self.img[i], "cls": self.cls[i]}


class _Repeat:
    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class RepeatingLoader(DataLoader):
    """Reuses one iterator across epochs: its batch sampler repeats, its ``__iter__`` gives one epoch of it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", _Repeat(self.batch_sampler))
        self.iterator = None

    def __len__(self) -> int:
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        if self.iterator is None:
            self.iterator = self._get_iterator()
        for _ in range(len(self)):
            yield next(self.iterator)


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.SiLU()
        )
        self.head = nn.Conv2d(32, 3, 1)
        with torch.no_grad():  # the stride probe
            self.stride = 32 / self.body(torch.zeros(1, 3, 32, 32)).shape[-1]

    def forward(self, batch):
        x = batch["img"] if isinstance(batch, dict) else batch
        out = self.head(self.body(x)).mean((2, 3))
        return nn.functional.cross_entropy(out, batch["cls"]) if isinstance(batch, dict) else out


def build_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    g = [[], [], []]  # weights with decay, norm weights, biases
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            g[2 if name == "bias" else 1 if isinstance(m, nn.BatchNorm2d) else 0].append(p)
    return torch.optim.AdamW(
        [
            {"params": g[0], "lr": lr, "weight_decay": 0.0005},
            {"params": g[1], "lr": lr, "weight_decay": 0.0},
            {"params": g[2], "lr": lr, "weight_decay": 0.0},
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Detector()
    torch.optim.AdamW(model.parameters())  # a throwaway: built to check the setup, never stepped
    train = RepeatingLoader(Boxes(32), batch_size=4, shuffle=True, num_workers=0)
    val = RepeatingLoader(Boxes(8), batch_size=8, num_workers=0)
    optimizer = build_optimizer(model, LR)
    ema = copy.deepcopy(model).eval()
    for epoch in range(args.epochs):
        model.train()
        for i, batch in enumerate(train):
            batch = {"img": batch["img"].float() / 255, "cls": batch["cls"]}
            loss = model(batch)
            loss.backward()
            if i % 2 == 1:  # gradients accumulated over 2 batches
                optimizer.step()
                optimizer.zero_grad()
        with torch.no_grad():
            for batch in val:
                ema({"img": batch["img"].float() / 255, "cls": batch["cls"]})
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
