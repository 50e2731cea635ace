#!/usr/bin/env bash
# Train on N ranks of this machine with horovodrun: over MPI where mpirun is installed, whose
# all-reduce costs a fraction of Gloo's (benchmarks/README.md: allreduce, peers), else over Gloo.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"

usage() {
    cat <<USAGE
usage: $PROG N [hvdtrain train arguments...]

Runs N ranks of 'hvdtrain train' on this machine: horovodrun -np N -H localhost:N --mpi where
mpirun is on PATH, --gloo otherwise. CONTROLLER=gloo (or mpi) picks one.
example:
  $PROG 2 --preset digits --epochs 5
  CONTROLLER=gloo $PROG 2 --preset digits
USAGE
}
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    '') usage >&2; die "give the number of ranks N" ;;
esac
is_count "$1" || die "N must be a positive integer, got '$1' (see --help)"
ranks=$1
shift
need horovodrun "run 'make install' and put .venv/bin on PATH"
controller=${CONTROLLER:-}
if [ -z "$controller" ]; then
    controller=gloo
    command -v mpirun >/dev/null 2>&1 && controller=mpi
fi
case "$controller" in
    mpi) need mpirun "install Open MPI (apt-get install openmpi-bin libopenmpi-dev), or CONTROLLER=gloo" ;;
    gloo) ;;
    *) die "CONTROLLER must be mpi or gloo, got '$controller'" ;;
esac
exec horovodrun -np "$ranks" -H "localhost:$ranks" "--$controller" hvdtrain train "$@"
