"""An ImageNet-style training script written the way `ptt doctor script` recommends (no finding expected).

Written for this project's tests in the style of the common public example scripts. Runs on the CPU.
``--loader ptt`` reads the same folder through ``ptt.make_loader`` (uint8 batches, normalised on the device).
"""

import argparse

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torchvision
from torchvision import datasets, transforms


def to_float(images, device):
    images = images.to(device, non_blocking=True)
    return images.float().div_(255) if images.dtype == torch.uint8 else images


def validate(loader, model, criterion, device):
    model.eval()
    total = torch.zeros((), device=device)
    with torch.inference_mode():
        for images, target in loader:
            images = to_float(images, device)
            total += criterion(model(images), target.to(device, non_blocking=True))
    return total.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", default="")
    parser.add_argument("--print-freq", type=int, default=10)
    parser.add_argument("--loader", choices=("torch", "ptt"), default="torch")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    cudnn.benchmark = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.loader == "ptt":
        import pytorchtricks as ptt

        train_ds = ptt.JpegFolder(args.data)
        train_loader = ptt.make_loader(train_ds, 8, crop=32, num_workers=args.workers, seed=args.seed)
    else:
        tf = transforms.Compose([transforms.RandomResizedCrop(32), transforms.ToTensor()])
        train_ds = datasets.ImageFolder(args.data, tf)
        g = torch.Generator().manual_seed(args.seed)
        train_loader = torch.utils.data.DataLoader(
            train_ds,
            batch_size=8,
            shuffle=True,
            num_workers=args.workers,
            pin_memory=True,
            generator=g,
            persistent_workers=args.workers > 0,
        )
    model = torchvision.models.resnet18(num_classes=len(train_ds.classes)).to(device)
    if args.resume:
        model.load_state_dict(torch.load(args.resume, weights_only=True))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda")
    running = torch.zeros((), device=device)
    model.train()
    for step, (images, target) in enumerate(train_loader):
        images = to_float(images, device)
        target = target.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=False):
            loss = criterion(model(images), target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        running += loss.detach()
        if step % args.print_freq == 0:
            print(f"step {step} loss {running.item() / (step + 1):.6f}")
        if step + 1 >= args.steps:
            break
    validate(train_loader, model, criterion, device)


if __name__ == "__main__":
    main()
