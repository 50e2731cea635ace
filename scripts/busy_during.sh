#!/usr/bin/env bash
# How busy a command keeps this machine: wall seconds, CPU seconds of the whole machine (from
# /proc/stat) and their ratio to what its cores could give. Run it on an otherwise quiet machine.
#
#   scripts/busy_during.sh LOG COMMAND...   (COMMAND's output goes to LOG, the figures too)
set -uo pipefail
log=$1
shift
busy_and_total() {  # the machine's busy and total jiffies since boot
    read -r _ user nice system idle iowait irq softirq steal _ </proc/stat
    local busy=$((user + nice + system + irq + softirq + steal))
    echo "$busy $((busy + idle + iowait))"
}
read -r busy0 total0 < <(busy_and_total)
start=$(date +%s.%N)
"$@" >"$log" 2>&1
status=$?
read -r busy1 total1 < <(busy_and_total)
python3 -c "
wall, cpu = $(date +%s.%N) - $start, ($busy1 - $busy0) / $(getconf CLK_TCK)
print(f'status {$status}, wall {wall:.0f} s, cpu {cpu:.0f} s, busy {($busy1 - $busy0) / ($total1 - $total0):.2f} of $(nproc) cores')" | tee -a "$log"
exit "$status"
