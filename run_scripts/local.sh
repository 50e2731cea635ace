#!/usr/bin/env bash
# Train on N ranks of this machine with horovodrun over Gloo (no MPI needed at run time).
#   run_scripts/local.sh N [hvdtrain train arguments...]
#   run_scripts/local.sh 2 --preset digits --epochs 5
set -euo pipefail

usage() { echo "usage: $0 N [hvdtrain train arguments...]   (N = number of ranks, >= 1)"; }
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    ''|*[!0-9]*|0) usage >&2; exit 2 ;;
esac
ranks=$1
shift
command -v horovodrun >/dev/null || { echo "horovodrun not on PATH: run 'make install' and activate .venv" >&2; exit 2; }
exec horovodrun -np "$ranks" -H "localhost:$ranks" --gloo hvdtrain train "$@"
