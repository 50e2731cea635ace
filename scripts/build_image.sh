#!/usr/bin/env bash
# `make image`: builds the container image hvdtrain:latest from container/Containerfile with
# podman, installing what is missing first and skipping what is there (as scripts/setup.sh):
#   1. podman, buildah, crun and mmdebstrap from Debian (apt, as root);
#   2. the base image localhost/debian:bookworm, made with mmdebstrap from Debian's mirror and
#      imported, standing in for Docker Hub's debian:bookworm where no registry is reachable;
#   3. the build context: the committed sources the Containerfile copies;
#   4. podman build (niced: the build compiles Horovod), then the image's size and build time.
# IMAGE (hvdtrain:latest), BASE_IMAGE (localhost/debian:bookworm), MIRROR (Debian's), REV (the
# commit hvdtrain is built from, HEAD) override; BUILD_FLAGS adds podman build options
# (BUILD_FLAGS=--no-cache builds every step again).
set -euo pipefail

cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-hvdtrain:latest}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

STEP=image
# shellcheck source=scripts/common.sh
source scripts/common.sh  # say, die, as_root, podman_ready, base_image, pip_ca

# 1. The tools, and 2. the base: Debian 12's minimal system (scripts/common.sh).
podman_ready
base_image "$BASE_IMAGE" "$MIRROR"

# 3. The context: the repository's files the Containerfile copies (.dockerignore names them),
# as committed at REV (HEAD): the image holds a commit, named in its revision label, not a
# working tree's edits. The same layout as the repository root, which `podman build -f
# container/Containerfile .` takes as it is.
REV=$(git rev-parse "${REV:-HEAD}")
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mapfile -t sources < <(git show "$REV:.dockerignore" | sed -n 's/^!//p')
git archive "$REV" -- container/Containerfile .dockerignore "${sources[@]}" | tar -xf - -C "$context"

# pip inside the build reaches PyPI itself; where the host's pip needs a CA bundle of its own
# (pip_ca), the build mounts it for its RUN steps only: it is not copied into the image.
ca=$(pip_ca)
ca_args=()
if [ -n "$ca" ]; then
    ca_args=(--volume "$ca:/run/build-ca.crt:ro" --build-arg BUILD_CA=/run/build-ca.crt)
fi

# 4. The build. --pull=never: the base is local, and no registry is asked.
say "building $IMAGE from container/Containerfile and hvdtrain at ${REV:0:12} (the first build takes 10-20 minutes: TensorFlow, then Horovod's compile)"
start=$(date +%s)
# shellcheck disable=SC2086  # BUILD_FLAGS: words
"${PODMAN[@]}" build --pull=never "${ULIMITS[@]}" --build-arg "BASE=$BASE_IMAGE" \
    ${ca_args[@]+"${ca_args[@]}"} --label "org.opencontainers.image.revision=$REV" \
    ${BUILD_FLAGS:-} --tag "$IMAGE" --file "$context/container/Containerfile" "$context"
seconds=$(( $(date +%s) - start ))
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in ${seconds}s: $(( size / 1000000 )) MB (podman image inspect .Size, uncompressed)"
