#!/usr/bin/env bash
# Train on the hosts of an Open MPI hostfile with mpirun (Horovod's MPI controller).
set -euo pipefail
source "$(dirname "$0")/_lib.sh"

usage() {
    cat <<USAGE
usage: $PROG -f HOSTFILE [options] [--] [hvdtrain train arguments...]

Runs 'hvdtrain train' on every slot of HOSTFILE through mpirun. HOSTFILE lines are
'host slots=N' (Open MPI) or 'host:N' (horovodrun); '#' starts a comment.

options:
  -f, --hostfile FILE   the hosts and their slots (required)
  -n, --np N            ranks to start (default: all slots; at most the slots)
  -i, --interface IF    network interface for MPI's traffic, e.g. eth0 (default: MPI picks)
  -b, --bind WHAT       mpirun --bind-to: none (default; TensorFlow threads span the
                        rank's share of the host), core or socket
  -x, --export VAR      also pass VAR to every rank (repeatable; PATH, LD_LIBRARY_PATH,
                        PYTHONPATH, VIRTUAL_ENV, TF_*, HOROVOD_*, OMPI_MCA_* and NCCL_* go already)
  -p, --program CMD     what each rank runs (default: 'hvdtrain train')
      --dry-run         print the mpirun command instead of running it
  -h, --help            this help

example:
  $PROG -f hosts.txt -i eth0 -- --preset digits --epochs 5
USAGE
}

hostfile="" ranks="" interface="" bind=none program="hvdtrain train" dry=0 exports=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -f|--hostfile) hostfile=${2:-}; shift 2 || die "$1 needs a value" ;;
        -n|--np) ranks=${2:-}; shift 2 || die "$1 needs a value" ;;
        -i|--interface) interface=${2:-}; shift 2 || die "$1 needs a value" ;;
        -b|--bind) bind=${2:-}; shift 2 || die "$1 needs a value" ;;
        -x|--export) exports+=("${2:-}"); shift 2 || die "$1 needs a value" ;;
        -p|--program) program=${2:-}; shift 2 || die "$1 needs a value" ;;
        --dry-run) dry=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done

[ -n "$hostfile" ] || { usage >&2; die "a hostfile is required (-f HOSTFILE)"; }
slots=$(total_slots "$hostfile")
ranks=${ranks:-$slots}
check_ranks "$ranks" "$slots" "$hostfile"
case "$bind" in none|core|socket) ;; *) die "--bind must be none, core or socket, got '$bind'" ;; esac
need mpirun "install Open MPI (make install does it)"
read -r -a rank_program <<<"$program"
need "${rank_program[0]}" "activate the virtualenv that has hvdtrain (source .venv/bin/activate)"

# Every rank needs the launcher's software environment: the same virtualenv and settings.
mapfile -t forward < <(mpirun_exports "${exports[@]}")
cmd=(mpirun -np "$ranks" --hostfile "$hostfile" --map-by slot --bind-to "$bind" "${forward[@]}")
if [ -n "$interface" ]; then
    # Both MPI's data (btl) and its start-up wiring (oob) must use the chosen link.
    cmd+=(--mca btl_tcp_if_include "$interface" --mca oob_tcp_if_include "$interface")
fi
show_or_run "$dry" "${cmd[@]}" "${rank_program[@]}" "$@"
