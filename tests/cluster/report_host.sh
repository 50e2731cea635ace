#!/bin/sh
# Test helper: records which host this rank runs on (host name and the address of its link),
# then runs the rest of the command line in its place.
#   REPORT_DIR=... REPORT_IFACE=hvd0 report_host.sh hvdtrain train ...
rank=${HOROVOD_RANK:-${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:?no rank in the environment}}}
address=$(ip -o -4 addr show dev "$REPORT_IFACE" | awk '{print $4}')
echo "$(hostname) ${address%/*}" > "$REPORT_DIR/rank$rank.host"
exec "$@"
