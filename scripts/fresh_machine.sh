#!/usr/bin/env bash
# `make fresh-machine`: the README's quick start on a machine that has nothing else. A container
# of Debian 12's minimal system (mmdebstrap --variant=minbase, the base of `make image`), a clone
# of HEAD in it, and the lines of the README's quick-start block run one by one as root, as a
# newcomer types them; then the result file, written from the run's log:
#   1. podman, mmdebstrap and the base image localhost/debian:bookworm (scripts/common.sh);
#   2. the commands: the README's block at HEAD, `git clone <repository>` cloning a bundle of
#      HEAD, and `make test` run as `make test-fast` (FRESH_TEST): make test needs the second
#      stack, the whole suite on both, and network namespaces and SLURM's daemons, which an
#      unprivileged container cannot make (the result file says more);
#   3. the run, niced, under a hard limit (FRESH_LIMIT, 90m), the container removed whatever
#      happens; its log in runs/fresh-machine/;
#   4. benchmarks/results/fresh-machine-DATE.md (FRESH_RESULT): each command's exit status and
#      wall time, the demo's eval accuracy, the tests' summary, what scripts/setup.sh installed.
# Tens of minutes (TensorFlow's download, Horovod's compile), as root. Not part of make test.
# `--dry-run` prints the commands of step 2 and stops (FRESH_README=FILE reads FILE, not HEAD's).
set -euo pipefail

cd "$(dirname "$0")/.."
BASE_IMAGE=${BASE_IMAGE:-localhost/debian:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
FRESH_TEST=${FRESH_TEST:-test-fast}
FRESH_LIMIT=${FRESH_LIMIT:-90m}
DAY=$(date -u +%F)  # the run's day, in the result's name and title however long it runs
FRESH_RESULT=${FRESH_RESULT:-benchmarks/results/fresh-machine-$DAY.md}

STEP=fresh
# shellcheck source=scripts/common.sh
source scripts/common.sh  # say, die, as_root, podman_ready, base_image, pip_ca

case "${1:-}" in
    "") dry_run="" ;;
    --dry-run) dry_run=1 ;;
    *) die "unknown option $1: the one option is --dry-run" ;;
esac

# 2 first (1 needs root). The commands, from the README as committed: its first code block
# under "## Quick start".
readme=$(if [ -n "${FRESH_README:-}" ]; then cat "$FRESH_README"; else git show HEAD:README.md; fi)
block=$(awk '/^## Quick start/ {q = 1} q && /^```/ {n++; next} q && n == 1 {print} n == 2 {exit}' <<<"$readme")
[ -n "$block" ] || die "README.md has no code block under '## Quick start'"
grep -q '^git clone <repository> ' <<<"$block" || die "README.md's quick start has no 'git clone <repository> ...' line"
commands=$(sed -e 's|<repository>|/src/hvdtrain.bundle|' -e "s/^make test\\( \\|\$\\)/make $FRESH_TEST\\1/" <<<"$block")
if [ -n "$dry_run" ]; then printf '%s\n' "$commands"; exit 0; fi

# Root, not sudo: the run goes under `timeout`, which cannot call as_root.
[ "$(id -u)" -eq 0 ] || die "run as root (rootful podman): sudo make fresh-machine"
git diff --quiet HEAD -- README.md scripts Makefile \
    || say "note: uncommitted edits to README.md, scripts/ or the Makefile are not what runs (HEAD is)"

# 1. The tools and the base.
podman_ready
base_image "$BASE_IMAGE" "$MIRROR"

REV=$(git rev-parse HEAD)
work=$(mktemp -d)
name="hvdtrain-fresh-$$"
# The container goes with the script: podman's own --rm, and `rm -f` where timeout killed podman
# (the container's bash, its PID 1, ignores the SIGTERM podman passes on).
trap 'rm -rf "$work"; "${PODMAN[@]}" rm -f --ignore "$name" >/dev/null 2>&1 || true' EXIT
printf '%s\n' "$commands" >"$work/commands"
# HEAD and its branch, so that the clone checks out a branch, as a clone of a repository does.
branch=$(git symbolic-ref -q --short HEAD || true)
git bundle create -q "$work/hvdtrain.bundle" HEAD ${branch:+"$branch"}
# In the container: each line in one shell (its `cd` carries on), timed, the run stopping at the
# first that fails; "@@fresh" lines are what step 4 reads.
cat >"$work/inside.sh" <<'EOF'
set -u
cd /root
# What was installed by name (the README's apt-get line, setup.sh's), however the run ends.
apt-mark showmanual >/tmp/manual-before
trap 'echo "@@fresh manual $(apt-mark showmanual | comm -13 /tmp/manual-before - | tr "\n" " ")"' EXIT
echo "@@fresh base Debian $(cat /etc/debian_version), $(dpkg-query -W | wc -l) packages, $(nproc) CPUs"
while IFS= read -r -u 3 line; do
    shown=${line%%  #*}
    echo "@@fresh run ${shown%"${shown##*[! ]}"}"
    start=$(date +%s)
    eval "$line"
    rc=$?
    echo "@@fresh status $rc $(( $(date +%s) - start ))"
    [ "$rc" -eq 0 ] || exit "$rc"
done 3</src/commands
EOF

# 3. The run. --network host: apt reaches Debian's mirror and pip PyPI as the host does;
# --shm-size: a machine's /dev/shm (half its memory), not podman's 64 MB, for Open MPI.
ca=$(pip_ca)
ca_args=()
[ -z "$ca" ] || ca_args=(--volume "$ca:/run/pip-ca.crt:ro" --env PIP_CERT=/run/pip-ca.crt)
mkdir -p runs/fresh-machine
log="runs/fresh-machine/$(date -u +%Y%m%d-%H%M%S).log"
say "running the README's quick start at ${REV:0:12} in a container of $BASE_IMAGE (tens of minutes; limit $FRESH_LIMIT): $log"
start=$(date +%s)
set +e
timeout --kill-after=60 "$FRESH_LIMIT" "${PODMAN[@]:1}" run --rm --name "$name" --network host \
    "${ULIMITS[@]}" --shm-size 2g --volume "$work:/src:ro" ${ca_args[@]+"${ca_args[@]}"} \
    "$BASE_IMAGE" bash /src/inside.sh 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
seconds=$(( $(date +%s) - start ))

# 4. The result, from the log.
field() { sed -n "s/^@@fresh $1 //p" "$log"; }
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE_IMAGE")
# Either may be missing (a failed run): `|| true`, or set -e would end the script here unsaid.
accuracy=$(grep -o 'done: eval accuracy.*' "$log" | tail -1 || true)
summary=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$log" | tail -1 || true)
case $rc in
    0) verdict="every command passed" ;;
    124|137) verdict="stopped by the limit ($FRESH_LIMIT)" ;;
    *) verdict="stopped at the first command that failed" ;;
esac
{
    echo "# A fresh machine: the README's quick start in a bare Debian 12 container ($DAY)"
    echo
    echo "\`make fresh-machine\` (scripts/fresh_machine.sh), run $(date -u -d "@$start" '+%F %H:%M') UTC: hvdtrain at commit"
    echo "\`${REV:0:12}\` (\`git clone\` of a bundle of HEAD), in a container of \`$BASE_IMAGE\`:"
    echo "Debian 12 as \`mmdebstrap --variant=minbase\` makes it ($(( size / 1000000 )) MB;"
    echo "$(field base)), as root, niced, on a host of $(nproc) CPUs with \`--network host\`."
    echo "The lines of the README's quick-start block, one by one, in one shell:"
    echo
    echo "| command | exit | wall |"
    echo "|---|---|---|"
    # A command the limit stopped has no status line.
    paste <(field run) <(field status) | while IFS=$'\t' read -r command status; do
        if [ -n "$status" ]; then echo "| \`$command\` | ${status% *} | ${status#* } s |"
        else echo "| \`$command\` | (stopped) | |"; fi
    done
    echo
    echo "The whole run: exit $rc ($verdict) in ${seconds} s."
    echo
    echo "- the demo: \`${accuracy:-no eval accuracy line}\`"
    echo "- \`make $FRESH_TEST\`: \`${summary:-no pytest summary line}\`"
    # shellcheck disable=SC2016  # the backticks are Markdown's
    grep -E '^  skipped: ' "$log" | sed 's/^  skipped: /  - skipped: `/; s/$/`/' || true
    echo "- what scripts/setup.sh installed, in its own lines:"
    # shellcheck disable=SC2016
    grep -E '^\[setup\] (installing|creating)' "$log" | sed 's/^/  - `/; s/$/`/' || echo "  - nothing"
    echo "- the packages installed by name in the run (\`apt-mark showmanual\`, less the base's): $(field manual)"
    if [ "$FRESH_TEST" != test ]; then
        echo
        echo "Not run: \`make test\` (\`make $FRESH_TEST\` in its place). Its multi-host and SLURM tests"
        echo "need network namespaces and SLURM's daemons, which an unprivileged container cannot make"
        echo "(CAP_SYS_ADMIN, CAP_NET_ADMIN: they would skip, or fail where root's tests are expected),"
        echo "and a privileged one is no longer a bare machine; and it builds the second stack (another"
        echo "TensorFlow, another Horovod compile) and runs the whole suite on both, tens of minutes"
        echo "more on 2 cores. The clean-clone runs of \`make test\` on the development machines cover it."
    fi
} >"$FRESH_RESULT"
say "exit $rc in ${seconds}s ($verdict): $FRESH_RESULT, log $log"
exit "$rc"
