#!/bin/bash
# Open MPI's busy-polling (mpi_yield_when_idle=0) against hvdtrain's default (1): bench network at 0.1 Gbit/s, one round each
cd /work/main
for how in busy default; do
  echo "$how start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ $how = busy ]; then export OMPI_MCA_mpi_yield_when_idle=0; else unset OMPI_MCA_mpi_yield_when_idle; fi
  timeout 900 .venv/bin/hvdtrain bench network --speeds 0.1 --rounds 1 --systems hvdtrain,hvdtrain-overlap --out /tmp/probe/busy/$how > /tmp/probe/busy/$how.log 2>&1
  echo "$how rc $? end $(date -u +%H:%M:%S)"
done
