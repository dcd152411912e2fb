#!/bin/bash
# The alternated order this folder's runs were made in (one at a time, under the benchmark lock).
cd "$(dirname "$0")"
B=/work/wt-before A=/work/main
for step in "data $B before-1" "data $A after-1" "infer $B before-1" "infer $A after-1" "demo $B before-1" "demo $A after-1" "data $A after-2" "data $B before-2" "demo $A after-2" "demo $B before-2"; do
  set -- $step
  echo "$(date -u +%T) start $step"
  flock /tmp/ptt-bench.lock ./run.sh $1 $2 $3 > /tmp/rc30-$1-$3.log 2>&1 || echo "FAILED $step"
  echo "$(date -u +%T) end $step"
done
