#!/usr/bin/env bash
# Host discovery for elastic training: prints a hosts file as horovodrun's "host:slots" lines.
#   run_scripts/elastic.sh --min-np 2 --max-np 4 -d "run_scripts/discover_hosts.sh hosts.txt"
# horovodrun runs it about once a second: edit the file to add or remove hosts while the job runs.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"

usage() {
    cat <<USAGE
usage: $PROG [HOSTS_FILE]

Prints the hosts available for elastic training, one 'host:slots' per line, as horovodrun's
--host-discovery-script expects. HOSTS_FILE (default: \$HVDTRAIN_HOSTS_FILE) takes the same
lines as a hostfile: 'host:N' or 'host slots=N', '#' comments, blank lines.
USAGE
}
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
esac
hosts_file=${1:-${HVDTRAIN_HOSTS_FILE:-}}
[ -n "$hosts_file" ] || die "no hosts file: pass one, or set HVDTRAIN_HOSTS_FILE (see --help)"
# All or nothing: printing half of a file that has a bad line would drop hosts from the job.
rows=$(hostfile_slots "$hosts_file") || exit 2
while read -r host slots; do
    [ -n "$host" ] && echo "$host:$slots"
done <<<"$rows"
exit 0
