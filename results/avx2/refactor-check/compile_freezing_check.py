# compile+freezing vs eager fp32, ResNet-18 160 px b1, one thread: bench-infer's row alone (the tree on PYTHONPATH)
import copy, time, statistics, sys, warnings, torch, torchvision
warnings.filterwarnings("ignore")
import pytorchtricks as ptt
try:
    from pytorchtricks.fixtures import randomize_bn_
except ImportError:
    from pytorchtricks.bench.workloads import randomize_bn_
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
x = torch.randn(1, 3, 160, 160)
fused = ptt.fuse_conv_bn_(copy.deepcopy(base), x)
cf = ptt.compile_(copy.deepcopy(fused), for_inference=True)
fns = {"eager": base, "cf": cf}
ts = {k: [] for k in fns}
with torch.no_grad():
    for f in fns.values():
        for _ in range(5): f(x)
    for _ in range(9):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(10): f(x)
            ts[k].append(time.perf_counter() - t)
r = [e / c for e, c in zip(ts["eager"], ts["cf"])]
print(sys.argv[2], "ratio", round(statistics.median(r), 3), "min", round(min(r), 3), "max", round(max(r), 3))
