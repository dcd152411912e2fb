#!/bin/bash
# The alternated order of this folder's runs (ABBA per kind; one at a time, under the benchmark lock).
cd "$(dirname "$0")"
B=/work/wt-before49 A=/work/main
for step in "data $B before-1" "data $A after-1" "det $B before-1" "det $A after-1" "demo $B before-1" "demo $A after-1" \
            "data $A after-2" "data $B before-2" "det $A after-2" "det $B before-2"; do
  set -- $step
  echo "$(date -u +%T) start $step"
  flock /tmp/ptt-bench.lock ./run.sh $1 $2 $3 > /tmp/rc49-$1-$3.log 2>&1 || echo "FAILED $step"
  echo "$(date -u +%T) end $step"
done
