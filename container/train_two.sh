#!/usr/bin/env bash
# Two containers of hvdtrain:latest on one podman network train on 2 ranks across them, started
# as the Kubeflow MPI Operator starts a job: each container runs the image's sshd as mpiuser with
# an SSH key pair mounted read-only at /home/mpiuser/.ssh (id_rsa, id_rsa.pub, authorized_keys;
# the operator's Secret, sshAuthMountPath), and the first one, as the launcher, runs
#   mpirun -np 2 --hostfile HOSTFILE --display-map hvdtrain train --preset digits [ARGS]
# as mpiuser, HOSTFILE naming the two containers. The containers, the network and the keys are
# removed at the end. Run as root after `make image` (container/README.md).
set -euo pipefail

IMAGE=${IMAGE:-hvdtrain:latest}
NET=${NET:-hvdtrain-net}
NAMES=(hvdtrain-worker-0 hvdtrain-worker-1)
# As scripts/build_image.sh: runc and the host's limits on these machines.
PODMAN=(nice -n 19 podman --runtime runc)
ULIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=32768:32768)

say() { printf '[two] %s\n' "$*"; }
keys=$(mktemp -d)
made_net=""
cleanup() {
    podman rm -f -t 0 "${NAMES[@]}" >/dev/null 2>&1 || true
    [ -z "$made_net" ] || podman network rm "$NET" >/dev/null 2>&1 || true
    rm -rf "$keys"
}
trap cleanup EXIT

command -v ssh-keygen >/dev/null \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-client >/dev/null
# The operator's key pair: ECDSA P-521, mounted under RSA's file names, owned by mpiuser (1000).
ssh-keygen -q -t ecdsa -b 521 -N '' -C hvdtrain-two -f "$keys/id_rsa"
cp "$keys/id_rsa.pub" "$keys/authorized_keys"
chmod 600 "$keys/id_rsa"
chown -R 1000:1000 "$keys"

if ! podman network exists "$NET"; then
    podman network create "$NET" >/dev/null
    made_net=1
fi
for name in "${NAMES[@]}"; do
    "${PODMAN[@]}" run -d --name "$name" --hostname "$name" --network "$NET" "${ULIMITS[@]}" \
        --volume "$keys:/home/mpiuser/.ssh:ro" "$IMAGE" >/dev/null
done
say "containers ${NAMES[*]} on network $NET ($IMAGE), sshd as mpiuser in each"

# The hostfile, in the launcher's home, and SSH from the launcher to each worker by name.
printf '%s slots=1\n' "${NAMES[@]}" | podman exec -i "${NAMES[0]}" sh -c 'cat >hostfile'
for name in "${NAMES[@]}"; do
    for _ in $(seq 30); do
        podman exec "${NAMES[0]}" ssh "$name" true 2>/dev/null && break
        sleep 1
    done
    say "ssh ${NAMES[0]} -> $name: $(podman exec "${NAMES[0]}" ssh "$name" 'echo $(id -un)@$(hostname) $(command -v hvdtrain)')"
done

# --display-map: Open MPI prints which container each rank runs in, before the job starts.
say "podman exec ${NAMES[0]} mpirun -np 2 --hostfile hostfile --display-map hvdtrain train --preset digits $*"
"${PODMAN[@]}" exec "${NAMES[0]}" mpirun -np 2 --hostfile hostfile --display-map \
    hvdtrain train --preset digits "$@"
