#!/bin/bash
# hvdtrain under Gloo in 2 MB buckets (two inter-op threads, its default with buckets) against Horovod's script with one and with two inter-op threads: bench network at three speeds, 3 interleaved rounds
cd "$(dirname "$0")/../../.."
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 5400 .venv/bin/hvdtrain bench network --speeds 0.05,0.1,1 --rounds 3 --systems hvdtrain-gloo-overlap,horovod,horovod-inter-op-2 --horovod-synthetic "${HOROVOD_SYNTHETIC:?the path of tensorflow2_synthetic_benchmark.py from Horovod v0.28.1}" --horovod-venv .venv-keras2 --out "${1:-/tmp/network-horovod-inter-op}"
echo "rc $? end $(date -u +%H:%M:%S)"
