#!/bin/bash
# Where each rank's one core goes on bench network's link: every rank thread's CPU time sampled
# (sample.py) while bench network runs one round at one speed, under each variant below.
#   run.sh OUT_DIR    then    phases.py OUT_DIR/NAME.jsonl.gz SYSTEM,SYSTEM ...
cd "$(dirname "$0")/../../.."
here=benchmarks/results/network-thread-cpu
out=${1:-/tmp/network-thread-cpu}
mkdir -p "$out"
probe() {   # NAME SPEED SYSTEMS [VAR=VALUE ...]: one round, sampled; NICE=N renices Horovod's thread
  local name=$1 speed=$2 systems=$3; shift 3
  python3 $here/sample.py "$out/$name.jsonl" & local sampler=$!
  local renicer=
  case " $* " in *" NICE="*) env "$@" python3 $here/renice.py & renicer=$! ;; esac
  echo "$name start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  env "$@" timeout 1200 .venv/bin/hvdtrain bench network --speeds "$speed" --rounds 1 \
      --systems "$systems" --out "$out/$name" > "$out/$name.log" 2>&1
  echo "$name rc $? end $(date -u +%H:%M:%S)"
  kill $sampler $renicer 2>/dev/null
  gzip -f "$out/$name.jsonl"
}
probe buckets-mpi-and-gloo-0.05 0.05 hvdtrain-overlap,hvdtrain-gloo-overlap
probe horovod-cpu-operations-gloo 0.05 hvdtrain,hvdtrain-overlap HOROVOD_CPU_OPERATIONS=gloo
probe cycle-5ms-0.05 0.05 hvdtrain,hvdtrain-overlap HOROVOD_CYCLE_TIME=5
probe nice-19-0.05 0.05 hvdtrain,hvdtrain-overlap NICE=19
for n in 0 19 10; do probe nice-$n-0.1 0.1 hvdtrain,hvdtrain-overlap NICE=$n; done
