#!/bin/bash
# hvdtrain's Gloo buckets at several bucket_mb on a 0.1 Gbit/s link (transfer about as long as backprop): one bench network per size, sizes interleaved, the order reversed every other round
cd "$(dirname "$0")/../../.."
out="${1:-/tmp/network-bucket-size}"
rounds="${ROUNDS:-3}"
first="${FIRST_ROUND:-1}"   # to resume a run that was stopped
sizes=(${SIZES:-1 2 4 8})   # SIZES="2 8" for fewer
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = first; r <= rounds; r++)); do
    order=("${sizes[@]}")
    if ((r % 2 == 0)); then order=($(printf '%s\n' "${sizes[@]}" | tac)); fi
    for mb in "${order[@]}"; do
        echo "round $r, bucket_mb $mb: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
        timeout 900 .venv/bin/hvdtrain bench network --speeds 0.1 --rounds 1 \
            --systems hvdtrain-gloo-overlap --bucket-mb "$mb" --out "$out/mb$mb-round$r"
        echo "rc $?"
    done
done
echo "end $(date -u +%H:%M:%S)"
