#!/bin/bash
# Open MPI's TCP transport tuned for data that moves while the rank computes, against its
# defaults: hvdtrain under mpirun (one all-reduce, 2 MB buckets) at 0.2 Gbit/s, one round per
# run, alternating. mpirun passes OMPI_MCA_* variables to every host's ranks.
#   buffers4m: socket buffers set (btl_tcp_sndbuf/rcvbuf 4 MB, net.core.*mem_max here; the
#              kernel doubles it) instead of the kernel's autotuning
#   eager4m:   messages up to 4 MB sent eagerly, in one fragment, without the rendezvous
#              (btl_tcp_eager_limit and btl_tcp_max_send_size 4 MB)
cd "$(dirname "$0")/../../.."
settings() {
  case $1 in
    default) ;;
    buffers4m) echo OMPI_MCA_btl_tcp_sndbuf=4194304 OMPI_MCA_btl_tcp_rcvbuf=4194304 ;;
    eager4m) echo OMPI_MCA_btl_tcp_eager_limit=4194304 OMPI_MCA_btl_tcp_max_send_size=4194304 ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
for i in ${RUNS:-1 2}; do
  for v in ${ORDER:-default buffers4m}; do
    echo "== $v $i start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    # shellcheck disable=SC2046
    env $(settings "$v") timeout 900 .venv/bin/hvdtrain bench network --speeds "${SPEED:-0.2}" \
      --rounds 1 --systems "${SYSTEMS:-hvdtrain,hvdtrain-overlap}" \
      --out "${OUT:-/tmp/network-tcp-buffers}/$v-$i" 2>&1 \
      | grep -v "^\[" | grep "samples/s\|moved\|error"
  done
done
echo "== end $(date -u +%T)"
