#!/bin/bash
# Open MPI polled every 200 us with sleeps between, against Horovod's blocking calls: hvdtrain
# under mpirun (one all-reduce, 2 MB buckets) at 0.2 Gbit/s, one round per run, alternating.
# Before it: Horovod 0.28.1's source with hvdtrain's patches and horovod-0.28.1-sleeping-poll.patch
# (runs 1 and 2: its mpi_operations.cc part only; run 3: both parts) built with
#   pip install --no-build-isolation --no-deps --target BUILD SOURCE   (hvdtrain's BUILD_ENV)
# and BUILD/horovod/tensorflow/mpi_lib*.so copied over .venv's (saved first, put back after).
# The patch does nothing unless OMPI_MCA_hvdtrain_poll_us is set; mpirun passes OMPI_MCA_*
# variables to every host's ranks.
cd "$(dirname "$0")/../../.."
for i in ${RUNS:-1 2}; do
  for v in ${ORDER:-blocking sleep200}; do
    echo "== $v $i start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ $v = sleep200 ]; then export OMPI_MCA_hvdtrain_poll_us=200; else unset OMPI_MCA_hvdtrain_poll_us; fi
    timeout 900 .venv/bin/hvdtrain bench network --speeds 0.2 --rounds 1 \
      --systems hvdtrain,hvdtrain-overlap --out "${OUT:-/tmp/network-mpi-sleep-poll}/$v-$i" 2>&1 \
      | grep -v "^\[" | grep "samples/s\|moved\|error"
  done
done
echo "== end $(date -u +%T)"
