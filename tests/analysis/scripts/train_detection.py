"""A detection training script of the shape of torchvision's reference (references/detection/train.py in
pytorch/vision), small enough for a test: CocoDetection wrapped for transforms v2 with the "hflip" policy, a
Subset, a batch sampler that groups images by aspect ratio, a list collate, a torchvision detector whose training
forward takes the images and targets and returns a dict of losses, summed for the backward.

    python train_detection.py COCO_ROOT [--steps N] [-j WORKERS] [-b BATCH]
"""

import argparse

import torch
import torchvision
from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
from torchvision.transforms import v2 as T


class GroupedBatchSampler(torch.utils.data.BatchSampler):
    """Batches of images of one aspect-ratio group (landscape or portrait), as the reference's sampler makes."""

    def __init__(self, sampler, group_ids, batch_size):
        self.sampler, self.group_ids, self.batch_size = sampler, group_ids, batch_size

    def __iter__(self):
        buckets = {}
        for i in self.sampler:
            b = buckets.setdefault(self.group_ids[i], [])
            b.append(i)
            if len(b) == self.batch_size:
                yield list(b)
                b.clear()

    def __len__(self):
        return len(self.sampler) // self.batch_size


def collate(batch):
    return tuple(zip(*batch))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("-j", "--workers", type=int, default=0)
    ap.add_argument("-b", "--batch-size", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    policy = T.Compose([T.RandomHorizontalFlip(0.5), T.PILToTensor(), T.ToDtype(torch.float, scale=True)])
    ds = CocoDetection(f"{args.root}/images", f"{args.root}/annotations.json", transforms=policy)
    ds = wrap_dataset_for_transforms_v2(ds, target_keys=("boxes", "labels", "image_id"))
    ds = torch.utils.data.Subset(ds, list(range(len(ds))))
    sizes = [ds.dataset.coco.imgs[i] for i in ds.dataset.ids]
    groups = [int(s["width"] >= s["height"]) for s in sizes]
    sampler = GroupedBatchSampler(torch.utils.data.RandomSampler(ds), groups, args.batch_size)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, num_workers=args.workers, collate_fn=collate
    )
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    model.train()
    step = 0
    while step < args.steps:
        for images, targets in loader:
            loss_dict = model(list(images), list(targets))
            losses = sum(loss for loss in loss_dict.values())
            optimizer.zero_grad()
            losses.backward()
            optimizer.step()
            print(f"step {step} loss {losses.item():.4f}")
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
