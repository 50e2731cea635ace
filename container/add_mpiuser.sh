#!/bin/sh
# The image's user and SSH set-up (both Containerfiles run it as root, then delete it): the
# non-root user the MPI Operator's sshAuthMountPath names (mpiuser, uid 1000, as its non-root
# example), an SSH server run as that user on port 2222, and the client's settings.
#
# The operator mounts id_rsa, id_rsa.pub and authorized_keys from a Secret, read-only, into
# /home/mpiuser/.ssh: the client must not write known_hosts, and the server, run as mpiuser,
# uses the mounted key as its host key (it cannot read /etc/ssh's). SetEnv: mpirun's remote ranks
# start through sshd, whose PATH (and LD_LIBRARY_PATH, where the image sets one) would miss the
# image's own.
set -eu
useradd --create-home --uid 1000 --shell /bin/bash mpiuser
mkdir -p /run/sshd /home/mpiuser/.ssh
printf '%s\n' \
    'Port 2222' \
    'PidFile /home/mpiuser/.sshd.pid' \
    'HostKey /home/mpiuser/.ssh/id_rsa' \
    'AuthorizedKeysFile /home/mpiuser/.ssh/authorized_keys' \
    'StrictModes no' \
    'PasswordAuthentication no' \
    "SetEnv PATH=$PATH${LD_LIBRARY_PATH:+ LD_LIBRARY_PATH=$LD_LIBRARY_PATH}" \
    >/home/mpiuser/.sshd_config
printf '%s\n' 'Host *' \
    '    Port 2222' \
    '    StrictHostKeyChecking no' \
    '    UserKnownHostsFile /dev/null' \
    '    LogLevel ERROR' \
    >>/etc/ssh/ssh_config
chown -R mpiuser:mpiuser /home/mpiuser
