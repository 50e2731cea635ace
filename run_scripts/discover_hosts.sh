#!/usr/bin/env bash
# Host discovery for elastic training: prints the hosts file's "host:slots" lines for horovodrun.
#   horovodrun -np 2 --min-np 1 --max-np 4 \
#       --host-discovery-script "run_scripts/discover_hosts.sh hosts.txt" hvdtrain train --elastic
# Horovod runs it every few seconds: edit the file to add or remove hosts while the job runs.
set -euo pipefail

usage() {
  cat <<USAGE
usage: discover_hosts.sh [HOSTS_FILE]
Prints the hosts available for elastic training, one "host:slots" per line, as
horovodrun --host-discovery-script expects. HOSTS_FILE (default: \$HVDTRAIN_HOSTS_FILE) holds
one "host:slots" per line; blank lines and lines starting with # are skipped.
USAGE
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
esac
hosts_file="${1:-${HVDTRAIN_HOSTS_FILE:-}}"
if [[ -z "$hosts_file" ]]; then
  echo "discover_hosts.sh: no hosts file: pass one, or set HVDTRAIN_HOSTS_FILE" >&2
  usage >&2
  exit 2
fi
if [[ ! -r "$hosts_file" ]]; then
  echo "discover_hosts.sh: cannot read hosts file $hosts_file" >&2
  exit 2
fi

line_number=0
hosts=()
while IFS= read -r line || [[ -n "$line" ]]; do
  line_number=$((line_number + 1))
  line="${line%%#*}"                   # drop comments
  line="${line//[[:space:]]/}"
  [[ -z "$line" ]] && continue
  if [[ ! "$line" =~ ^[A-Za-z0-9._-]+:[1-9][0-9]*$ ]]; then
    echo "discover_hosts.sh: $hosts_file line $line_number: expected host:slots (e.g. node1:4), got '$line'" >&2
    exit 2
  fi
  hosts+=("$line")
done < "$hosts_file"
# Nothing is printed unless the whole file is good: a half-read file would drop hosts.
if (( ${#hosts[@]} > 0 )); then printf '%s\n' "${hosts[@]}"; fi
