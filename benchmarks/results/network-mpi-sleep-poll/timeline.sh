#!/bin/bash
# Rank 0's Horovod timeline of one bench network round at 0.2 Gbit/s, per system: the file is
# copied once the link's run has printed its rate (the one-host run that follows rewrites it).
#   timeline.sh OUT_DIR    then    .venv/bin/python timeline_steps.py OUT_DIR/SYSTEM.json ...
cd "$(dirname "$0")/../../.."
out=${1:-/tmp/network-timelines}
mkdir -p "$out"
for sys in ${SYSTEMS:-hvdtrain-overlap hvdtrain-gloo-overlap hvdtrain}; do
  ( HOROVOD_TIMELINE=$out/live-$sys.json HOROVOD_TIMELINE_MARK_CYCLES=1 timeout 900 .venv/bin/hvdtrain bench network \
      --speeds 0.2 --rounds 1 --systems $sys --out $out/out-$sys > $out/$sys.log 2>&1 ) &
  pid=$!
  until grep -q "samples/s" $out/$sys.log 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.5; done
  cp $out/live-$sys.json $out/$sys.json
  wait $pid
  grep "samples/s\|moved" $out/$sys.log
done
