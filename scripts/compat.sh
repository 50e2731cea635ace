#!/usr/bin/env bash
# The TensorFlow range, measured (`make compat`; too long for CI: about 10 to 15 minutes per
# version on 2 cores, most of it Horovod's build). For every version given (default: the newest
# patch of every minor from 2.15 to 2.21), the user's path of docs/install.md in a fresh venv:
# pip install tensorflow-cpu==VERSION (pip picks the newest Keras it allows), the hvdtrain wheel
# with its test extra, `hvdtrain setup horovod`, `hvdtrain doctor`; then the correctness core
# (2 ranks x B == 1 rank x 2B, identical weights, resume) from
# tests/multirank/test_multirank.py, one launcher per test. One table row per version into
# benchmarks/results/compat-DATE.md; a version that fails says at which step, and the step's log
# is kept.
#
#   scripts/compat.sh [WORK_DIR] [VERSION...]      e.g. scripts/compat.sh /tmp/compat 2.19.1
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/tmp/hvdtrain-compat}
shift || true
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(2.15.1 2.16.2 2.17.1 2.18.1 2.19.1 2.20.0 2.21.0)
PYTHON=${PYTHON:-python3.11}
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
    echo "# TensorFlow versions, measured ($(date -u +%Y-%m-%d), $(nproc) cores, $("$PYTHON" -V))"
    echo
    echo "Each in a fresh venv from the wheel: scripts/compat.sh (make compat)."
    echo
    echo "| tensorflow-cpu | keras | numpy | setup horovod (s) | doctor | correctness core | note |"
    echo "|---|---|---|---|---|---|---|"
} >"$TABLE"

step() {  # step NAME LOG COMMAND...: runs it, its output into LOG; fails with the step's name
    local name=$1 log=$2
    shift 2
    "$@" >"$log" 2>&1 || { failed="$name (see $log)"; return 1; }
}

for version in "${VERSIONS[@]}"; do
    say "tensorflow-cpu $version"
    venv="$WORK/tf-$version"
    rm -rf "$venv"
    failed="" seconds="" doctor="" core=""
    if step venv "$WORK/$version-venv.log" "$PYTHON" -m venv "$venv" \
       && step "pip install" "$WORK/$version-pip.log" \
            "$venv/bin/pip" install "tensorflow-cpu==$version" "$WHEEL[test]"; then
        start=$(date +%s)
        if step "setup horovod" "$WORK/$version-setup.log" \
                env PATH="$venv/bin:$PATH" "$venv/bin/hvdtrain" setup horovod; then
            seconds=$(( $(date +%s) - start ))
            step doctor "$WORK/$version-doctor.log" env PATH="$venv/bin:$PATH" \
                "$venv/bin/hvdtrain" doctor && doctor=ok || doctor=FAIL
            step core "$WORK/$version-core.log" env PATH="$venv/bin:$PATH" \
                "$venv/bin/python" -m pytest tests/multirank/test_multirank.py -q -k "$CORE" \
                --launcher-turns other -p no:cacheprovider
            core=$(tail -1 "$WORK/$version-core.log")
        fi
    fi
    versions=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("keras"), m.version("numpy"))' 2>/dev/null || echo "- -")
    echo "| $version | ${versions% *} | ${versions#* } | ${seconds:--} | ${doctor:--} | ${core:--} | ${failed:+failed at $failed} |" >>"$TABLE"
done
say "table: $TABLE"
