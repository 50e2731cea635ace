#!/bin/bash
# fp16 compression against one float32 all-reduce: bench network, 3 speeds, 3 interleaved rounds
cd "$(dirname "$0")/../../.."
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 3000 .venv/bin/hvdtrain bench network --speeds 0.05,0.1,1 --rounds 3 --systems hvdtrain,hvdtrain-fp16 --out "${1:-/tmp/network-fp16}"
echo "rc $? end $(date -u +%H:%M:%S)"
