"""An ImageNet-style training script with planted performance problems (for `ptt doctor script`).

Written for this project's tests in the style of the common public example scripts: argparse, ImageFolder, a
torchvision ResNet, SGD, train/validate loops with meters. It runs on the CPU: python train_planted.py DATA --steps 3
"""

import argparse
import os

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torchvision
from torchvision import datasets, transforms


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n=1):
        self.sum += value * n
        self.count += n


def validate(loader, model, criterion, device):
    model.eval()
    total = 0.0
    for images, target in loader:
        images = images.to(device)
        total += criterion(model(images), target.to(device))
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    cudnn.benchmark = True
    cudnn.deterministic = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tf = transforms.Compose([transforms.RandomResizedCrop(32), transforms.ToTensor()])
    train_ds = datasets.ImageFolder(args.data, tf)
    train_loader = torch.utils.data.DataLoader(
        train_ds, batch_size=8, shuffle=True, num_workers=args.workers, pin_memory=True
    )
    val_loader = torch.utils.data.DataLoader(train_ds, batch_size=8)
    model = torchvision.models.resnet18(num_classes=len(train_ds.classes))
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model.to(device)
    if args.resume and os.path.exists(args.resume):
        model.load_state_dict(torch.load(args.resume))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler(enabled=False)
    losses = AverageMeter()
    model.train()
    step = 0
    while step < args.steps:
        for images, target in train_loader:
            images = images.to(device)
            target = target.to(device)
            weights = torch.ones(len(train_ds.classes)).to(device)
            with torch.cuda.amp.autocast(enabled=False):
                loss = nn.functional.cross_entropy(model(images), target, weight=weights)
            optimizer.zero_grad(set_to_none=False)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.update(loss.item(), images.size(0))
            print(f"step {step} loss {loss.item():.6f}")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            step += 1
            if step >= args.steps:
                break
    validate(val_loader, model, criterion, device)


if __name__ == "__main__":
    main()
