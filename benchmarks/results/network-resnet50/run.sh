#!/bin/bash
# ResNet-50 (102 MB of gradients) on bench network's links: hvdtrain with one all-reduce under
# mpirun and in 8 MB Gloo buckets, Horovod's script under mpirun and under Gloo, 3 interleaved
# rounds of 3 timed steps. HOROVOD_SYNTHETIC: tensorflow2_synthetic_benchmark.py of Horovod v0.28.1.
cd "$(dirname "$0")/../../.."
echo "start $(date -u '+%F %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
timeout 9000 make bench-network HOROVOD_SYNTHETIC="${HOROVOD_SYNTHETIC:?the path of tensorflow2_synthetic_benchmark.py from Horovod v0.28.1}" \
    NETWORK_MODEL=resnet50 NETWORK_OUT=benchmarks/results/network-resnet50 \
    NETWORK_SPEEDS=0.1,0.4,2.5 NETWORK_SYSTEMS=hvdtrain,hvdtrain-gloo-overlap,horovod,horovod-gloo \
    BENCH_ARGS="--steps 3 --bucket-mb 8"
echo "rc $? end $(date -u '+%F %H:%M:%S') UTC"
