#!/usr/bin/env bash
# Elastic training with horovodrun (Gloo): ranks may leave and join while the job runs.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"

usage() {
    cat <<USAGE
usage: $PROG --min-np A --max-np B -d DISCOVERY [options] [--] [hvdtrain train arguments...]

Runs 'hvdtrain train --elastic' under horovodrun's elastic mode. DISCOVERY is an executable
that prints the hosts available now, one 'host:slots' per line (see discover_hosts.sh);
horovodrun calls it again and again, and the job grows or shrinks between A and B ranks.

options:
  --min-np A            fewest ranks to keep training with (below: wait, then stop)
  --max-np B            most ranks to use
  -n, --np N            ranks to start with (default: A)
  -d, --discovery CMD   the host discovery script, with its arguments if any (required)
  -i, --interface IF    network interface for Gloo's traffic, e.g. eth0 (needed when the
                        hosts are names of one machine, like localhost and 127.0.0.1)
  -t, --timeout S       horovodrun --elastic-timeout: how long to wait for --min-np ranks
                        after a loss (horovodrun's default: 600)
      --dry-run         print the horovodrun command instead of running it
  -h, --help            this help

example:
  $PROG --min-np 2 --max-np 4 -d "run_scripts/discover_hosts.sh hosts.txt" -- --preset digits
USAGE
}

min="" max="" start="" discovery="" interface="" timeout="" dry=0
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --min-np) min=${2:-}; shift 2 || die "$1 needs a value" ;;
        --max-np) max=${2:-}; shift 2 || die "$1 needs a value" ;;
        -n|--np) start=${2:-}; shift 2 || die "$1 needs a value" ;;
        -d|--discovery) discovery=${2:-}; shift 2 || die "$1 needs a value" ;;
        -i|--interface) interface=${2:-}; shift 2 || die "$1 needs a value" ;;
        -t|--timeout) timeout=${2:-}; shift 2 || die "$1 needs a value" ;;
        --dry-run) dry=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done

is_count "$min" || die "--min-np must be a positive integer, got '$min' (see --help)"
is_count "$max" || die "--max-np must be a positive integer, got '$max'"
[ "$min" -le "$max" ] || die "--min-np $min is larger than --max-np $max"
start=${start:-$min}
is_count "$start" || die "--np must be a positive integer, got '$start'"
[ "$min" -le "$start" ] && [ "$start" -le "$max" ] || die "--np $start is outside $min..$max"
[ -z "$timeout" ] || is_count "$timeout" || die "--timeout must be a positive integer, got '$timeout'"
[ -n "$discovery" ] || die "a host discovery script is required (-d FILE)"
read -r -a discovery_cmd <<<"$discovery"
[ -f "${discovery_cmd[0]}" ] || die "discovery script ${discovery_cmd[0]} does not exist"
[ -x "${discovery_cmd[0]}" ] || die "discovery script ${discovery_cmd[0]} is not executable (chmod +x)"
# The script must answer now, in horovodrun's format, with room for the starting ranks.
found=$(timeout 20 "${discovery_cmd[@]}") || die "discovery script $discovery failed or took over 20 s"
listed=$(mktemp); trap 'rm -f "$listed"' EXIT
printf '%s\n' "$found" >"$listed"
slots=$(total_slots "$listed" "the output of $discovery") || exit 2
[ "$start" -le "$slots" ] || die "$discovery lists $slots slots now, fewer than the $start ranks to start"
need horovodrun "run 'make install' and put .venv/bin on PATH"

cmd=(horovodrun -np "$start" --min-np "$min" --max-np "$max" --host-discovery-script "$discovery")
program=(hvdtrain train --elastic)
if [ -n "$interface" ]; then
    cmd+=(--network-interface "$interface")
    # horovodrun's rendezvous and every worker's notification service would listen on all
    # interfaces: hvdtrain.listeners binds them to this one (docs/cluster.md, "What a job
    # exposes").
    bound_to_interface cmd program
fi
[ -n "$timeout" ] && cmd+=(--elastic-timeout "$timeout")
rm -f "$listed"
show_or_run "$dry" "${cmd[@]}" "${program[@]}" "$@"
