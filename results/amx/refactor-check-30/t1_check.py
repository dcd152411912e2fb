"""channels_last and compile+freezing vs eager fp32, ResNet-18 160 px, batch 1, one thread: bench-infer's two 1-thread
rows whose before/after gap exceeded their run-to-run spread, alone (the tree on PYTHONPATH). 15 paired rounds of 20
calls; prints the median eager/variant ratio (min-max). Usage: python t1_check.py LABEL"""

import copy
import statistics
import sys
import warnings

import torch
import torchvision

import pytorchtricks as ptt
from pytorchtricks.clock import time_call
from pytorchtricks.fixtures import randomize_bn_

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
torch.manual_seed(0)
base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
x = torch.randn(1, 3, 160, 160)
x_cl = x.contiguous(memory_format=torch.channels_last)
fused = ptt.fuse_conv_bn_(copy.deepcopy(base), x)
fns = {
    "eager": (base, x),
    "channels_last": (ptt.to_channels_last_(copy.deepcopy(base)), x_cl),
    "compile+freezing": (ptt.compile_(copy.deepcopy(fused), for_inference=True), x),
}
ts: dict[str, list[float]] = {k: [] for k in fns}
with torch.no_grad():
    for f, inp in fns.values():
        for _ in range(5):
            f(inp)
    for _ in range(15):
        for k, (f, inp) in fns.items():
            ts[k].append(time_call(lambda f=f, inp=inp: [f(inp) for _ in range(20)])[1])
for k in ("channels_last", "compile+freezing"):
    r = [e / c for e, c in zip(ts["eager"], ts[k], strict=True)]
    print(sys.argv[1], k, round(statistics.median(r), 3), round(min(r), 3), round(max(r), 3))
