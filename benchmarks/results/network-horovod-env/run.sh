#!/bin/bash
# hvdtrain against Horovod's script launched as mpirun launches it and launched with hvdtrain's
# own launch defaults (horovod-hvdtrain-env), MobileNetV2 on bench network's links, 3 interleaved
# rounds. HOROVOD_SYNTHETIC: tensorflow2_synthetic_benchmark.py of Horovod v0.28.1.
cd "$(dirname "$0")/../../.."
echo "start $(date -u '+%F %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
timeout 5400 .venv/bin/hvdtrain bench network --speeds 0.07,0.2,1 --rounds 3 \
    --systems hvdtrain,horovod,horovod-hvdtrain-env \
    --horovod-synthetic "${HOROVOD_SYNTHETIC:?the path of tensorflow2_synthetic_benchmark.py from Horovod v0.28.1}" \
    --horovod-venv .venv-keras2 --out "${1:-benchmarks/results/network-horovod-env}"
echo "rc $? end $(date -u '+%F %H:%M:%S') UTC"
