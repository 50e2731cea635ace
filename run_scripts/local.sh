#!/usr/bin/env bash
# Train on N ranks of this machine with horovodrun over Gloo (no MPI needed at run time).
set -euo pipefail
source "$(dirname "$0")/_lib.sh"

usage() {
    cat <<USAGE
usage: $PROG N [hvdtrain train arguments...]

Runs N ranks of 'hvdtrain train' on this machine: horovodrun -np N -H localhost:N --gloo.
example:
  $PROG 2 --preset digits --epochs 5
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
exec horovodrun -np "$ranks" -H "localhost:$ranks" --gloo hvdtrain train "$@"
