#!/bin/bash
# hvdtrain's fp16 compression against Horovod's script's own (--fp16-allreduce): bench network on the two slow links, 3 interleaved rounds
cd "$(dirname "$0")/../../.."
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 2400 .venv/bin/hvdtrain bench network --speeds 0.05,0.1 --rounds 3 --systems hvdtrain-fp16,horovod-fp16 --horovod-synthetic "${HOROVOD_SYNTHETIC:?the path of tensorflow2_synthetic_benchmark.py from Horovod v0.28.1}" --horovod-venv .venv-keras2 --out "${1:-/tmp/network-fp16-horovod}"
echo "rc $? end $(date -u +%H:%M:%S)"
