#!/usr/bin/env bash
# make test's lanes: every test on the main stack, the correctness core on the other one.
#
#   scripts/test_lanes.sh MAIN_VENV [OTHER_VENV]
#
# Alone, a lane leaves a core idle part of the time (start-up waits, one-process steps, the
# launchers' teardown; benchmarks/results/test_lanes.md), so two lanes run side by side:
#   main    the main stack's multi-rank tests
#   beside  the other stack's lane (its core and its unit tests but the `one_stack` ones),
#           then the main stack's unit tests and the tests marked `beside` (test_faults*.py
#           and a few refusals), its output held back and shown once it ends
# A test under both launchers runs under one on the other stack; on the main stack, where the
# tests of the launchers' own behaviour run under both, so do all but those marked
# `either_launcher`, which take the launcher the other stack's lane does not
# (--launcher-turns, tests/conftest.py).
# The tests marked `alone` (the SLURM tests) run last, with nothing beside them. The exit
# status is 1 if any lane failed.
set -uo pipefail

cd "$(dirname "$0")/.."
main_venv=$1
other_venv=${2:-}
MAIN='multirank and not beside and not alone'
BESIDE='(not multirank or beside) and not alone'

lane() {  # VENV PYTEST_ARGS...: pytest with that venv's tools first on PATH
    local venv=$1
    shift
    PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest --durations=15 "$@"
}

ended() {  # STATUS: true when pytest ran to its end (passed or failed), false if interrupted
    case $1 in 0|1) return 0 ;; *) return 1 ;; esac
}

beside_lane() {
    local status=0 done
    if [ -n "$other_venv" ]; then
        echo "== $other_venv: the correctness core and the unit tests, one launcher per test"
        lane "$other_venv" -m "(core or not multirank) and not one_stack" --launcher-turns other
        done=$?
        ended "$done" || return "$done"
        status=$done
    fi
    echo "== $main_venv: the unit tests and the tests marked beside"
    lane "$main_venv" -m "$BESIDE" --launcher-turns main
    done=$?
    ended "$done" || return "$done"
    return $((status | done))
}

stop_beside() {  # an interrupted run: the beside lane ends its jobs as on Ctrl-C, then stops
    if [ -n "$beside" ] && kill -INT -- "-$beside" 2>/dev/null; then
        wait "$beside"
        rm -f "$beside_log"
    fi
}

beside_log=$(mktemp)
set -m  # its own process group, where Ctrl-C (SIGINT) keeps its meaning
beside_lane >"$beside_log" 2>&1 &
beside=$!
set +m
trap stop_beside EXIT

echo "== $main_venv: the multi-rank tests (the beside lane's output follows)"
lane "$main_venv" -m "$MAIN" --launcher-turns main
main=$?
ended "$main" || exit "$main"
status=$main
wait "$beside" || status=1
beside=""
cat "$beside_log"
rm -f "$beside_log"
echo "== $main_venv: the tests that run alone"
lane "$main_venv" -m alone || status=1
exit "$status"
