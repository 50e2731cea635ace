#!/usr/bin/env bash
# The TensorFlow and Python range, measured (`make compat`; too long for CI: about 10 to 15
# minutes per row on 2 cores, most of it Horovod's build). For every version given (default: the
# newest patch of every minor from 2.15 to 2.21), on every Python in COMPAT_PYTHONS in turn
# (default: python3.11), the user's path of docs/install.md in a fresh venv: pip install
# tensorflow-cpu==VERSION (pip picks the newest Keras it allows), the hvdtrain wheel with its
# test extra, `hvdtrain setup horovod`, `hvdtrain doctor`; then the correctness core
# (2 ranks x B == 1 rank x 2B, identical weights, resume) from
# tests/multirank/test_multirank.py, one launcher per test. One table row per Python and version
# into benchmarks/results/compat-DATE.md; a row that fails says at which step, and the step's log
# is kept; a TensorFlow with no wheel for that Python says so and is not a failure.
#
#   [COMPAT_PYTHONS="3.12 3.13"] scripts/compat.sh [--plan] [WORK_DIR] [VERSION...]
#   e.g. COMPAT_PYTHONS="3.11 /opt/py312/bin/python3" scripts/compat.sh /tmp/compat 2.21.0
#
# A Python is a command or a path; a bare version (3.12) means the command python3.12. --plan
# prints the rows (interpreter, version), one per line, and does nothing else.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PLAN=""
[ "${1:-}" != --plan ] || { PLAN=1; shift; }
WORK=${1:-/tmp/hvdtrain-compat}
shift || true
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(2.15.1 2.16.2 2.17.1 2.18.1 2.19.1 2.20.0 2.21.0)
PYTHONS=()
for python in ${COMPAT_PYTHONS:-python3.11}; do
    [[ "$python" =~ ^[0-9]+\.[0-9]+$ ]] && python=python$python
    PYTHONS+=("$python")
done
if [ -n "$PLAN" ]; then
    for version in "${VERSIONS[@]}"; do
        for python in "${PYTHONS[@]}"; do echo "$python $version"; done
    done
    exit 0
fi
for python in "${PYTHONS[@]}"; do  # every Python runs, before an hour of builds starts
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
        || { echo "[compat] error: $python is no Python 3.11 or later: set COMPAT_PYTHONS" >&2; exit 2; }
done
PYTHON=${PYTHONS[0]}  # builds the wheel
CORE='weights_identical or two_ranks_with_batch_b_equal or resume_to_4_equals_4'
TABLE=benchmarks/results/compat-$(date -u +%Y-%m-%d).md
mkdir -p "$WORK"

say() { printf '[compat] %s\n' "$*"; }

# The wheel, once, from this checkout (build goes into a venv of its own).
"$PYTHON" -m venv "$WORK/build-venv" && "$WORK/build-venv/bin/pip" install -q build \
    && "$WORK/build-venv/bin/python" -m build -w -o "$WORK/wheel" . >"$WORK/build.log" 2>&1 \
    || { say "cannot build the wheel: $WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/wheel/hvdtrain-*.whl | tail -1)

{
    echo "# TensorFlow versions, measured ($(date -u +%Y-%m-%d), $(nproc) cores)"
    echo
    echo "Each in a fresh venv from the wheel: scripts/compat.sh (make compat)."
    echo
    echo "| python | tensorflow-cpu | keras | numpy | setup horovod (s) | doctor | correctness core | note |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$TABLE"

step() {  # step NAME LOG COMMAND...: runs it, its output into LOG; fails with the step's name
    local name=$1 log=$2
    shift 2
    "$@" >"$log" 2>&1 || { failed="$name (see $log)"; return 1; }
}

row() {  # row PYTHON VERSION: one venv, its steps, one line of the table
    local python=$1 version=$2 py tag venv start seconds="" doctor="" core="" versions
    py=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
    tag="py${py%.*}-$version"
    venv="$WORK/$tag"
    say "python $py, tensorflow-cpu $version"
    rm -rf "$venv"
    failed=""
    if step venv "$WORK/$tag-venv.log" "$python" -m venv "$venv" \
       && step "pip install" "$WORK/$tag-pip.log" \
            "$venv/bin/pip" install "tensorflow-cpu==$version" "$WHEEL[test]"; then
        start=$(date +%s)
        if step "setup horovod" "$WORK/$tag-setup.log" \
                env PATH="$venv/bin:$PATH" "$venv/bin/hvdtrain" setup horovod; then
            seconds=$(( $(date +%s) - start ))
            step doctor "$WORK/$tag-doctor.log" env PATH="$venv/bin:$PATH" \
                "$venv/bin/hvdtrain" doctor && doctor=ok || doctor=FAIL
            step core "$WORK/$tag-core.log" env PATH="$venv/bin:$PATH" \
                "$venv/bin/python" -m pytest tests/multirank/test_multirank.py -q -k "$CORE" \
                --launcher-turns other -p no:cacheprovider
            core=$(tail -1 "$WORK/$tag-core.log")
        fi
    elif grep -q "No matching distribution found for tensorflow-cpu==" "$WORK/$tag-pip.log" 2>/dev/null; then
        failed="" core="" note="no tensorflow-cpu $version wheel for Python ${py%.*} on PyPI"
    fi
    versions=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("keras"), m.version("numpy"))' 2>/dev/null || echo "- -")
    echo "| $py | $version | ${versions% *} | ${versions#* } | ${seconds:--} | ${doctor:--} | ${core:--} | ${failed:+failed at $failed}${note:-} |" >>"$TABLE"
    note=""
}

note=""
for version in "${VERSIONS[@]}"; do  # each version on every Python, in the order given
    for python in "${PYTHONS[@]}"; do
        row "$python" "$version"
    done
done
say "table: $TABLE"
