#!/bin/bash
# Issue 30 before/after check: the same benchmarks from a worktree of each commit, alternated, on a quiet machine.
# before = b0081d4 (a9c8877^, the tree before issue 30's first commit); after = main. Both with main's venv
# (PYTHONPATH=<tree>/src puts that tree's package first). Usage: run.sh KIND TREE LABEL  (KIND: data | infer | demo)
set -euo pipefail
kind=$1 tree=$2 label=$3
here=$(cd "$(dirname "$0")" && pwd)
py=/work/main/.venv/bin/python
out=$here/$label
mkdir -p "$out"
export PYTHONPATH=$tree/src
cd "$tree"
case $kind in
  data)
    rm -rf /tmp/ptt-rc30-work /dev/shm/ptt-cache
    $py benchmarks/data_loading.py --src /work/main/data/photos --images 2000 --rounds 1 \
      --systems imagefolder,ptt-files,ptt-files-nowindow,ptt-shards,ptt-shards-noscale,ptt-tar,ptt-lmdb,ptt-shards-resize256,ptt-ram-cache \
      --work /tmp/ptt-rc30-work --out "$out" ;;
  infer)
    $py benchmarks/inference_cpu.py --batches 1 --rounds 3 --out "$out/inference_cpu-b1" ;;
  demo)
    rm -rf /dev/shm/ptt-cache ~/.cache/pytorchtricks/tune-pack-* "$out/tune-out"
    $py -m pytorchtricks.cli tune --out "$out/tune-out" > "$out/demo.txt" 2>&1 ;;
esac
git -C "$tree" rev-parse HEAD > "$out/commit.txt"
