#!/bin/bash
# hvdtrain under Gloo, one all-reduce and 2 MB buckets, against Horovod's script under mpirun: bench network at three speeds, 3 interleaved rounds
cd "$(dirname "$0")/../../.."
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 5400 .venv/bin/hvdtrain bench network --speeds 0.05,0.1,1 --rounds 3 --systems hvdtrain-gloo,hvdtrain-gloo-overlap,horovod --horovod-synthetic "${HOROVOD_SYNTHETIC:?the path of tensorflow2_synthetic_benchmark.py from Horovod v0.28.1}" --horovod-venv .venv-keras2 --out "${1:-/tmp/network-gloo-horovod}"
echo "rc $? end $(date -u +%H:%M:%S)"
