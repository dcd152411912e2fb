#!/bin/bash
# Second alternated set, after chain.sh: infer after/before, data before/after.
cd "$(dirname "$0")"
B=/work/wt-before A=/work/main
for step in "infer $A after-2" "infer $B before-2" "data $B before-3" "data $A after-3"; do
  set -- $step
  echo "$(date -u +%T) start $step"
  flock /tmp/ptt-bench.lock ./run.sh $1 $2 $3 > /tmp/rc30-$1-$3.log 2>&1 || echo "FAILED $step"
  echo "$(date -u +%T) end $step"
done
