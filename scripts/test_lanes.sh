#!/usr/bin/env bash
# make test's two lanes: every test on the main stack, the correctness core on the other one.
#
#   scripts/test_lanes.sh MAIN_VENV [OTHER_VENV]
#
# Alone, a lane leaves a core idle part of the time (start-up waits, one-process steps, the
# launchers' teardown; benchmarks/results/test_lanes.md), so the lanes run side by side, the
# other stack's output held back and shown once it ends. The tests marked `timed` (a bound of
# seconds, or a measured rate) run last, with nothing beside them. The exit status is 1 if any
# lane failed.
set -uo pipefail

cd "$(dirname "$0")/.."
main_venv=$1
other_venv=${2:-}
other=""

lane() {  # VENV PYTEST_ARGS...: pytest with that venv's tools first on PATH
    local venv=$1
    shift
    PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest --durations=15 "$@"
}

stop_other() {  # an interrupted run: the other lane ends its jobs as on Ctrl-C, then stops
    if [ -n "$other" ] && kill -INT -- "-$other" 2>/dev/null; then
        wait "$other"
        rm -f "$other_log"
    fi
}
trap stop_other EXIT

if [ -n "$other_venv" ]; then
    other_log=$(mktemp)
    set -m  # its own process group, where Ctrl-C (SIGINT) keeps its meaning
    lane "$other_venv" -m "core or not multirank" --launcher-turns >"$other_log" 2>&1 &
    other=$!
    set +m
fi
echo "== $main_venv: every test but the timed ones${other_venv:+ (beside it: $other_venv)}"
lane "$main_venv" -m "not timed"
main=$?
case $main in 0|1) ;; *) exit "$main" ;; esac  # interrupted, or pytest could not run
status=$main
if [ -n "$other" ]; then
    wait "$other" || status=1
    other=""
    echo "== $other_venv: the correctness core and the unit tests, one launcher per test"
    cat "$other_log"
    rm -f "$other_log"
fi
echo "== $main_venv: the timed tests, alone"
lane "$main_venv" -m timed || status=1
exit "$status"
