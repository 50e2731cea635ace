#!/usr/bin/env bash
# Installs what hvdtrain needs, and only what is missing: Open MPI (apt), a project virtualenv,
# the pinned stack (see STACK.md in the shared notes) and hvdtrain itself. Safe to run again:
# a second run checks and skips in a few seconds. `--with-test-tools` adds what the tests need.
#
# HVDTRAIN_STACK picks the stack, each in a virtualenv of its own (HVDTRAIN_VENV overrides):
#   keras3  TensorFlow 2.21 with Keras 3, hvdtrain's own Horovod binding       (.venv)
#   keras2  TensorFlow 2.15 with Keras 2, Horovod's own Keras layer            (.venv-keras2)
set -euo pipefail

cd "$(dirname "$0")/.."
STACK=${HVDTRAIN_STACK:-keras3}
# PYTHONS: the Pythons the stack runs on (TensorFlow 2.15 has wheels up to 3.11 only).
case "$STACK" in
    keras3) TF_VERSION=2.21.0 KERAS_PIN="keras==3.15.1" DEFAULT_VENV=.venv PYTHONS="3.11 3.12 3.13" ;;
    keras2) TF_VERSION=2.15.1 KERAS_PIN="" DEFAULT_VENV=.venv-keras2 PYTHONS="3.11" ;;
    *) printf '[setup] error: unknown stack %s: choose keras3 or keras2\n' "$STACK" >&2; exit 2 ;;
esac
VENV=${HVDTRAIN_VENV:-$DEFAULT_VENV}
PY="$VENV/bin/python"
TF_PIN="tensorflow-cpu==$TF_VERSION"

STEP=setup
# shellcheck source=scripts/common.sh
source scripts/common.sh  # say, die, as_root

# 1. Open MPI: Horovod's MPI controller and mpirun need the compiler wrapper and the launcher;
# Horovod's build applies hvdtrain's patches to its source with patch (not in a minimal Debian
# 12: make fresh-machine).
if ! command -v mpirun >/dev/null || ! command -v mpicxx >/dev/null || ! command -v patch >/dev/null; then
    say "installing Open MPI and build tools (apt)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        libopenmpi-dev openmpi-bin cmake g++ make patch >/dev/null
fi
# Horovod's Gloo build needs CMake 3.x; CMake 4 refuses Gloo's old cmake_minimum_required.
command -v cmake >/dev/null || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake >/dev/null

# 1b. `make test` only: the multi-host tests make network namespaces (iproute2) with an SSH
# server in each (openssh-server). Without root they skip, saying why.
if [ "${1:-}" = "--with-test-tools" ] && { ! command -v ip >/dev/null || [ ! -x /usr/sbin/sshd ]; }; then
    if [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null; then
        say "installing iproute2 and openssh-server for the multi-host tests (apt)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            iproute2 openssh-server openssh-client >/dev/null
    else
        say "no root: the multi-host tests will skip (they need iproute2, openssh-server, root)"
    fi
fi
# 1c. `make test` only: the SLURM tests run a real SLURM cluster (Debian's SLURM 22.05 and munge)
# on those namespaced hosts, with daemons and config of their own in the test's directory.
missing_slurm() {  # the daemons live in /usr/sbin, which a non-root PATH may lack
    local tool
    for tool in munged slurmctld slurmd sbatch srun scancel scontrol sinfo; do
        PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null || return 0
    done
    return 1
}
if [ "${1:-}" = "--with-test-tools" ] && missing_slurm; then
    if [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null; then
        say "installing slurmctld, slurmd, slurm-client and munge for the SLURM tests (apt)"
        # The packages' scripts would start system-wide munged and slurm daemons; the tests start
        # their own, so forbid starts during the install (the policy-rc.d that Docker images
        # ship), unless the machine has its own policy.
        made_policy=""
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            as_root sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
            made_policy=1
        fi
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            slurmctld slurmd slurm-client munge >/dev/null || install_failed=1
        [ -z "$made_policy" ] || as_root rm -f /usr/sbin/policy-rc.d
        [ -z "${install_failed:-}" ] || die "apt-get install of the SLURM packages failed"
    else
        say "no root: the SLURM tests will skip (they need slurmctld, slurmd, slurm-client, munge, root)"
    fi
fi

# 1d. Debian's Python 3, where the virtualenv is made from it (no PYTHON, or PYTHON=python3): the
# interpreter, its venv module (ensurepip: python3-venv) and its headers (Python.h: python3-dev,
# for Horovod's build). A minimal Debian 12 has none of them (make fresh-machine).
debian_python_ready() {
    python3 -c 'import ensurepip, os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null
}
if [ "${PYTHON:-python3}" = python3 ] && command -v apt-get >/dev/null && ! debian_python_ready; then
    say "installing python3, python3-venv and python3-dev (apt)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-dev >/dev/null
fi

# 2. The virtualenv, on a Python the stack runs on ($PYTHONS; hvdtrain reads TOML with tomllib,
# new in 3.11). PYTHON=python3.12 picks the interpreter, and makes anew a virtualenv on another.
PYTHON_ASKED=${PYTHON:-}
PYTHON=${PYTHON:-python3}
python_version() {  # python_version PYTHON: its major.minor; nothing if it does not run
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}
python_names() {  # "3.11", "3.11 or 3.12", "3.11, 3.12 or 3.13"
    local names=${PYTHONS// /, }
    case "$names" in *", "*) echo "${names%, *} or ${names##*, }" ;; *) echo "$names" ;; esac
}
refuse_python() {  # refuse_python PYTHON [VENV]: stops with one line unless the stack runs on it
    case " $PYTHONS " in *" $(python_version "$1") "*) return 0 ;; esac
    local newest=${PYTHONS##* } is fix version
    fix="Install python$newest and run again with PYTHON=python$newest"
    version=$("$1" -V 2>/dev/null) || version=""  # a pyenv shim of another version fails here
    if [ -z "$version" ]; then
        is="$1 is not found"
    elif [ -n "${2:-}" ]; then
        is="$2 runs $version" fix="rm -rf $2 and run again with PYTHON=python$newest"
    else
        is="$1 is $version"
    fi
    [ "$STACK" != keras2 ] || die "the keras2 stack needs Python $(python_names) (TensorFlow 2.15 stops there); $is. $fix."
    die "hvdtrain needs Python $(python_names); $is. $fix."
}
if [ ! -x "$PY" ]; then
    refuse_python "$PYTHON"
    say "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
elif [ -n "$PYTHON_ASKED" ] && [ "$(python_version "$PY")" != "$(python_version "$PYTHON")" ]; then
    refuse_python "$PYTHON"
    say "$VENV runs $("$PY" -V 2>&1), not $("$PYTHON" -V 2>&1) (PYTHON=$PYTHON): making it anew"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
refuse_python "$PY" "$VENV"
# The interpreter the virtualenv was made from, to make it anew on the same Python.
BASE_PYTHON=$("$PY" -c 'import sys; print(sys._base_executable)')
# numpy<2 where there is a numpy 1 wheel (Horovod 0.28.1 predates numpy 2); numpy 1.26 has no
# wheel for 3.13, where TensorFlow's own requirement picks a numpy 2 (measured: make compat).
NUMPY_PIN="numpy<2"
[ "$(python_version "$PY")" != 3.13 ] || NUMPY_PIN=""
PIP=("$PY" -m pip --disable-pip-version-check -q)

has_version() {  # has_version DIST VERSION-PREFIX: is DIST installed at that version?
    "$PY" -P - "$1" "$2" <<'PYEOF'  # -P: not the checkout's own hvdtrain.egg-info
import sys
from importlib import metadata
try:
    sys.exit(0 if metadata.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
except metadata.PackageNotFoundError:
    sys.exit(1)
PYEOF
}

# 3. The pinned Python stack (numpy: NUMPY_PIN above). Horovod is compiled against one
# TensorFlow, so a virtualenv holding another TensorFlow is made anew.
# pytest-timeout: the suite's hard limit per test (pyproject.toml), so that a hang fails a test.
tf_installed=$("$PY" -c 'from importlib import metadata; print(metadata.version("tensorflow-cpu"))' 2>/dev/null || true)
if [ -n "$tf_installed" ] && [ "$tf_installed" != "$TF_VERSION" ]; then
    say "$VENV holds tensorflow-cpu $tf_installed, not $TF_VERSION (stack $STACK): making it anew"
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
fi
if ! has_version tensorflow-cpu "$TF_VERSION" || { [ -n "$KERAS_PIN" ] && ! has_version keras "${KERAS_PIN#keras==}"; } \
   || ! has_version mpi4py 4 || ! has_version scikit-learn "" || ! has_version pytest "" \
   || ! has_version pytest-timeout 2 || ! has_version matplotlib "" || ! has_version tensorboard ""; then
    say "installing $TF_PIN ${KERAS_PIN:+$KERAS_PIN }(stack $STACK), ${NUMPY_PIN:-numpy}, mpi4py, scikit-learn, tensorboard, pytest, pytest-timeout, matplotlib (pip)"
    # tensorboard: TensorFlow 2.21 no longer brings it, and run.tensorboard's logs need it.
    "${PIP[@]}" install "$TF_PIN" ${KERAS_PIN:+"$KERAS_PIN"} ${NUMPY_PIN:+"$NUMPY_PIN"} "mpi4py>=4,<5" scikit-learn \
        tensorboard pytest "pytest-timeout>=2,<3" matplotlib wheel "setuptools>=64"
fi

# 3b. `make test`, `make test-fast` and `make lint` only: the linter and the type checker,
# pinned (pyproject.toml configures them), and pytest-xdist (test-fast's two workers).
RUFF_PIN=0.17.6 MYPY_PIN=2.4.1 XDIST_PIN=3.6.1
if [ "${1:-}" = "--with-test-tools" ] && { ! has_version ruff "$RUFF_PIN" || ! has_version mypy "$MYPY_PIN" \
   || ! has_version pytest-xdist "$XDIST_PIN"; }; then
    say "installing ruff $RUFF_PIN, mypy $MYPY_PIN and pytest-xdist $XDIST_PIN (pip)"
    "${PIP[@]}" install "ruff==$RUFF_PIN" "mypy==$MYPY_PIN" "pytest-xdist==$XDIST_PIN"
fi

# 4. Horovod, built from source against that TensorFlow with both MPI and Gloo controllers,
# patched where that TensorFlow needs it, horovodrun's build check made fast; nothing is rebuilt
# when it works. The same step as a user's `hvdtrain setup horovod`
# (hvdtrain/install/horovod_install.py and horovod_patches.py), run from the checkout.
# This checkout's own virtualenv also takes the in-place all-reduce patch where its Horovod was
# built before it (a user's working Horovod is only told: it may be a site's own GPU build).
rebuild=()
"$PY" -c 'import importlib.util, sys; from hvdtrain.install import horovod_patches as h
sys.exit(importlib.util.find_spec("horovod") is not None and not h.built_in_place())' \
    || rebuild=(--rebuild)
"$PY" -m hvdtrain.cli setup horovod "${rebuild[@]}" || die "the Horovod build failed (its output is above)"

# 5. hvdtrain itself, editable, so the checkout is what runs (again where an older editable
# install does not know a package the checkout has since gained, such as hvdtrain.bench).
if ! has_version hvdtrain "" || ! "$PY" -c 'import hvdtrain.bench' 2>/dev/null; then
    say "installing hvdtrain (editable)"
    "${PIP[@]}" install --no-deps --no-build-isolation -e .
fi

# The versions from the packages' metadata, without importing TensorFlow once more (setup
# horovod has just loaded it with Horovod's ops; and Keras 2's tf.keras has no __version__).
say "ready ($VENV): $("$PY" -c 'import importlib.metadata as m; from hvdtrain.install import horovod_install as h; print("tensorflow %s, keras %s, horovod %s" % (h.tensorflow_version(), m.version("keras"), m.version("horovod")))' 2>/dev/null), $(mpirun --version 2>&1 | head -1)"
