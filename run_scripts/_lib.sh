# Shared by the launch scripts (sourced, not run): messages, argument checks, hostfiles.
# The scripts only check their inputs and build a launcher command line: no training logic here.

PROG=${PROG:-run_scripts/$(basename "$0")}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }

need() {  # need COMMAND HINT: stop with HINT when COMMAND is not on PATH
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH: $2"
}

# horovodrun loads TensorFlow to check its own build: without this its C++ start-up chatter
# heads the output. The value is hvdtrain.launch.rank_process's (test_run_scripts.py checks); a
# level the user set wins.
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

is_count() { case "$1" in ''|*[!0-9]*|0*) return 1 ;; *) return 0 ;; esac; }

# hostfile_slots FILE [LABEL]: checks FILE (called LABEL in errors) and prints "HOST SLOTS" per
# host. Accepts Open MPI's "host slots=N" and horovodrun's "host:N" forms, "#" comments and blank
# lines; a host with no count has 1 slot.
hostfile_slots() {
    local file=$1 label=${2:-$1} n=0 line host slots rest
    [ -f "$file" ] || die "hostfile $file does not exist"
    [ -r "$file" ] || die "hostfile $file is not readable"
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line%%#*}
        read -r host rest <<<"$line" || true
        [ -n "$host" ] || continue
        slots=1
        case "$host" in
            *:*) slots=${host#*:}; host=${host%%:*} ;;
        esac
        case "$rest" in
            '') ;;
            slots=*|max_slots=*) slots=${rest#*slots=}; slots=${slots%% *} ;;
            *) die "$label line $n: expected 'HOST slots=N' or 'HOST:N', got '$line'" ;;
        esac
        is_count "$slots" || die "$label line $n: slots must be a positive integer, got '$slots'"
        echo "$host $slots"
    done <"$file"
}

# total_slots FILE [LABEL]: the sum of the slots in FILE (checked), at least one host.
total_slots() {
    local rows total=0 host slots
    rows=$(hostfile_slots "$@") || exit 2
    [ -n "$rows" ] || die "${2:-hostfile $1} names no host"
    while read -r host slots; do total=$((total + slots)); done <<<"$rows"
    echo "$total"
}

# check_ranks N SLOTS WHAT: N must be a positive count no larger than SLOTS.
check_ranks() {
    is_count "$1" || die "the number of ranks must be a positive integer, got '$1'"
    [ "$1" -le "$2" ] || die "$1 ranks asked for but $3 has only $2 slots"
}

# mpirun_exports [VAR...]: mpirun's "-x NAME" flags, one per line, that carry this shell's
# software environment (virtualenv, TensorFlow, Horovod, MPI and NCCL settings) plus the VARs
# named, to every rank. Unset variables are left out (mpirun rejects them).
mpirun_exports() {
    local name names=(PATH LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV "$@")
    while IFS='=' read -r name _; do
        case "$name" in TF_*|HOROVOD_*|OMPI_MCA_*|NCCL_*|OMPI_ALLOW_RUN_AS_ROOT*) names+=("$name") ;; esac
    done < <(env)
    for name in "${names[@]}"; do
        [ -n "${!name+set}" ] && printf -- '-x\n%s\n' "$name"
    done
    return 0
}

# show_or_run DRY_RUN COMMAND...: print the command (--dry-run), or replace this shell with it.
show_or_run() {
    local dry=$1; shift
    if [ "$dry" = 1 ]; then printf '%q ' "$@"; echo; exit 0; fi
    exec "$@"
}

# bound_to_interface LAUNCHER_ARRAY PROGRAM_ARRAY: rewrites the two arrays (horovodrun ... and
# what each rank runs) so that Horovod's listeners bind to the --network-interface given, not to
# every interface: both run under hvdtrain.listeners, with the Python that runs hvdtrain.
bound_to_interface() {
    local -n launcher_ref=$1 program_ref=$2
    local python=()
    need hvdtrain "activate the virtualenv that has hvdtrain (source .venv/bin/activate)"
    read -r -a python < <(sed -n '1s/^#!//p' "$(command -v hvdtrain)")
    [ -x "${python[0]:-}" ] || die "cannot find the Python of $(command -v hvdtrain)"
    launcher_ref=("${python[@]}" -m hvdtrain.listeners "${launcher_ref[@]}")
    # hvdtrain by its path: a rank's command line then names it, as when it runs alone.
    program_ref=("${python[@]}" -m hvdtrain.listeners "$(command -v hvdtrain)" "${program_ref[@]:1}")
}
