#!/bin/bash
# Issue 49 before/after check: the same benchmarks from a worktree of each commit, alternated, on a quiet machine.
# before = cb93b90 (the tree before this session's issue-49 work: typed source, loader runtime, config first, floors,
# function splits); after = main. Both with main's venv (PYTHONPATH=<tree>/src puts that tree's package first).
# Usage: run.sh KIND TREE LABEL  (KIND: data | det | demo)
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
    rm -rf /tmp/ptt-rc49-work /dev/shm/ptt-cache
    $py benchmarks/data_loading.py --src /tmp/ptt-bench-data/photos-2560 --images 2000 --rounds 1 \
      --systems imagefolder,ptt-files,ptt-shards,ptt-ram-cache --work /tmp/ptt-rc49-work --out "$out" ;;
  det)
    $py benchmarks/detection_data.py --images 60 --rounds 1 --systems tv-hflip,ptt \
      --peers-python $py --work /tmp/ptt-rc49-det --out "$out" ;;
  demo)
    rm -rf /dev/shm/ptt-cache ~/.cache/pytorchtricks/tune-pack-* "$out/tune-out"
    $py -m pytorchtricks.cli tune --out "$out/tune-out" > "$out/demo.txt" 2>&1 ;;
esac
git -C "$tree" rev-parse HEAD > "$out/commit.txt"
