#!/bin/bash
# bench network at 0.2 Gbit/s while host1's link byte counters are sampled every 5 ms from
# inside its namespace (sampler.py), each output line stamped with the time it was printed, so
# that directions.py can cut the counters at each system's run on the link.
#   gloo-and-mpirun:      SYSTEMS=hvdtrain-overlap,hvdtrain-gloo-overlap (the default)
#   mpirun-eager-buffers: SYSTEMS=hvdtrain-overlap with OMPI_MCA_btl_tcp_eager_limit,
#                         _max_send_size, _sndbuf and _rcvbuf at 4194304 in the environment
cd "$(dirname "$0")/../../.."
here=benchmarks/results/network-directions
out=${OUT:-/tmp/network-directions}
mkdir -p "$out"
( while :; do
    ns=$(ip netns list | awk '/^hvdt.*h1/ {print $1}' | head -1)
    [ -n "$ns" ] && break
    sleep 0.2
  done
  exec ip netns exec "$ns" python3 "$here/sampler.py" "$out/counters.txt" ) &
sampler=$!
echo "start $(date +%s.%N) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 900 .venv/bin/hvdtrain bench network --speeds 0.2 --rounds 1 \
  --systems "${SYSTEMS:-hvdtrain-overlap,hvdtrain-gloo-overlap}" --out "$out/bench" 2>&1 \
  | while IFS= read -r line; do echo "$(date +%s.%N) $line"; done | grep -v "\] \["
kill "$sampler" 2>/dev/null
pkill -f "$here/sampler.py"
echo "end $(date +%s.%N)"
