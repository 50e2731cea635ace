# shellcheck shell=bash
# What the installer scripts (setup.sh, build_image.sh, fresh_machine.sh) share; sourced after
# `STEP=NAME`, the name their lines carry ("[setup] ...").
say() { printf '[%s] %s\n' "$STEP" "$*"; }
die() { printf '[%s] error: %s\n' "$STEP" "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root (or sudo) to run: $*"; fi
}

# The podman scripts (make image, make fresh-machine) from here on.
#
# podman_ready: podman, buildah, crun, runc and mmdebstrap from Debian (apt, as root), where
# missing; sets PODMAN and ULIMITS, the command and the limits that work on these machines (a
# VM with cgroup v1 and an empty cgroup v2 hierarchy mounted beside it, and root without
# CAP_SYS_RESOURCE): runc (crun 1.8 refuses that "hybrid" cgroup layout), and resource limits
# no higher than the host's (podman's defaults, nofile 1048576 and nproc 4194304, cannot be set
# without CAP_SYS_RESOURCE). Rootful podman, niced: what runs in it compiles Horovod.
podman_ready() {
    local missing=() tool
    for tool in podman buildah crun mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} (apt)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah crun mmdebstrap >/dev/null
    fi
    as_root sh -c 'command -v runc >/dev/null' || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc >/dev/null
    PODMAN=(as_root nice -n 19 podman --runtime runc)
    # shellcheck disable=SC2034  # ULIMITS serves the scripts that source this file
    ULIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=32768:32768)
}

# base_image IMAGE MIRROR: Debian 12's minimal system (mmdebstrap --variant=minbase, as Docker
# Hub's debian:bookworm is built) from MIRROR, imported into podman as IMAGE, standing in for
# Docker Hub's image where no registry is reachable; made once, kept. After podman_ready.
base_image() {
    "${PODMAN[@]}" image exists "$1" && return 0
    say "making $1 with mmdebstrap from $2 (a minute)"
    local tar
    tar=$(mktemp --suffix=.tar)
    trap 'rm -f "$tar"' EXIT
    as_root nice -n 19 mmdebstrap --quiet --variant=minbase --format=tar bookworm "$tar" "$2"
    "${PODMAN[@]}" import --quiet "$tar" "$1" >/dev/null
    rm -f "$tar"
    trap - EXIT
}

# pip_ca: the CA bundle the host's pip needs to reach PyPI (a TLS proxy's), named by PIP_CERT or
# /etc/pip.conf's cert, or nothing; a container mounts it read-only for pip, never copies it in.
pip_ca() {
    local ca=${PIP_CERT:-$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' /etc/pip.conf 2>/dev/null | tail -1)}
    if [ -n "$ca" ] && [ -f "$ca" ]; then printf '%s\n' "$ca"; fi
}
