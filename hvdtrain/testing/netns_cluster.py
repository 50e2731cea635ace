"""A throw-away cluster of "hosts" on this machine: network namespaces joined by a bridge, each
with its own address, host name and SSH server, for real multi-host launches: the multi-host
tests' (tests/cluster/) and ``hvdtrain bench network``'s, which is why it ships in the wheel.

    with NetnsCluster(hosts=2, workdir=tmp_path) as cluster:
        cluster.run(["horovodrun", "-H", "host1:1,host2:1", ...], env=cluster.env(os.environ))

Each host also has its own UTS namespace (``hostname`` says host1, host2, ...) and sees a hosts
file naming every host's address, as on a real cluster. Gloo needs that: Horovod 0.28.1 builds
its process-set contexts from the host name, not from --network-interface, so a host name that
resolves to 127.0.0.1 (as this machine's does) breaks any multi-host Gloo job.

Everything lives inside namespaces the cluster creates: the bridge sits in a namespace of its own,
the hosts' links are veth pairs into it, and commands (launchers included) run inside the first
host, so no packet ever targets an address outside them or loopback. Leaving the ``with`` block
kills every process in the namespaces and deletes them, also when the test failed.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

from hvdtrain.testing import link_shaping

SUBNET = "10.213.47"          # a /24 private range for the namespaces' own addresses
INTERFACE = "hvd0"            # the name of each host's link, the same in every namespace
SSHD = "/usr/sbin/sshd"


def unavailable_reason(ssh: bool = True) -> str | None:
    """Why this machine cannot host the cluster (with SSH servers when ``ssh``), or None when
    it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", *(("ssh", "ssh-keygen") if ssh else ())):
        if not shutil.which(tool):
            return f"'{tool}' is not installed"
    if ssh and not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (apt-get install openssh-server; 'make test' does it as root)"
    probe = f"hvdtprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _delete_namespace(ns: str) -> None:
    """Kills whatever runs in ``ns`` (sshd, stray ranks), then deletes it and its links."""
    for _ in range(20):   # again while a dying daemon's children still show up
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        if not pids.stdout.split():
            break
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def remove_stale() -> None:
    """Deletes the namespaces of earlier test runs whose process is gone (killed mid-test)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns, pid in re.findall(r"^(hvdt(\d+)(?:h\d+|sw))\b", listed, flags=re.M):
        if not Path(f"/proc/{pid}").exists():
            _delete_namespace(ns)


def leftovers(tag: str) -> list[str]:
    """What the cluster tagged ``tag`` (its maker's process id) left on this machine: its
    namespaces, and veth links still in this namespace (made, not yet moved into a host)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return (re.findall(rf"^(hvdt{tag}(?:h\d+|sw))\b", listed, flags=re.M)
            + re.findall(rf"^\d+: (hv{tag}[ab]\d+)[@:]", links, flags=re.M))


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


class NetnsCluster:
    def __init__(self, hosts: int, workdir: Path, *, ssh: bool = True,
                 mbit_per_s: float | None = None, cores: Sequence[Sequence[int]] | None = None):
        """``mbit_per_s``: each host's link limited to that rate (``shape``; None: as fast as
        the machine moves it). ``cores``: per host, the cores its processes may run on (each
        host a share of the machine's, as separate machines would not compete; None: all)."""
        assert 2 <= hosts <= 9 and (cores is None or len(cores) == hosts)
        self.ssh = ssh    # an SSH server on every host (what horovodrun and mpirun -H need)
        self.mbit_per_s = mbit_per_s
        self.cores = [list(c) for c in cores] if cores is not None else None
        tag = str(os.getpid())   # in every name, so that remove_stale knows whose they are
        self.hosts = hosts
        self.workdir = Path(workdir)
        self.namespaces = [f"hvdt{tag}h{i}" for i in range(1, hosts + 1)]
        self.switch = f"hvdt{tag}sw"
        self.addresses = [f"{SUBNET}.{10 + i}" for i in range(1, hosts + 1)]
        self.names = [f"host{i}" for i in range(1, hosts + 1)]
        self.interface = INTERFACE
        self.tag = tag
        self.links = [f"hv{tag}a{i}" for i in range(1, hosts + 1)]   # as first made, in the root
        self.ssh_dir = self.workdir / "ssh"
        self.bin_dir = self.workdir / "bin"   # holds the `ssh` that launchers will find first
        self.hosts_file = self.workdir / "hosts"

    # ------------------------------------------------------------------------------------------
    def __enter__(self) -> "NetnsCluster":
        try:
            self._make_network()
            self.shape(self.mbit_per_s)
            self.hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
                f"{address} {name}\n" for address, name in zip(self.addresses, self.names)))
            if self.ssh:
                self._start_ssh_servers()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make_network(self) -> None:
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses), start=1):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            # The veth pair is born in this namespace for an instant; both ends move at once.
            host_end, switch_end = self.links[i - 1], f"hv{self.tag}b{i}"
            _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", switch_end)
            _sh("ip", "link", "set", host_end, "netns", ns)
            _sh("ip", "link", "set", switch_end, "netns", self.switch)
            _sh("ip", "-n", ns, "link", "set", host_end, "name", self.interface)
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", self.interface)
            _sh("ip", "-n", ns, "link", "set", self.interface, "up")
            _sh("ip", "-n", self.switch, "link", "set", switch_end, "master", "br0")
            _sh("ip", "-n", self.switch, "link", "set", switch_end, "up")

    def shape(self, mbit_per_s: float | None) -> None:
        """Every host's link limited to ``mbit_per_s`` from now on (None: the limit lifted)."""
        for ns in self.namespaces:
            link_shaping.shape(ns, self.interface, mbit_per_s)
        self.mbit_per_s = mbit_per_s

    def inside(self, host: int) -> list[str]:
        """The command prefix that runs a program on host ``host``: on its cores, in its
        network namespace, a UTS namespace of its own named hostN, and the cluster's hosts file
        on /etc/hosts."""
        cores = (["taskset", "-c", ",".join(map(str, self.cores[host]))]
                 if self.cores is not None else [])
        return [*cores, "ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "--mount",
                "sh", "-c", 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"',
                self.names[host], str(self.hosts_file)]

    def _start_ssh_servers(self) -> None:
        self.ssh_dir.mkdir(parents=True)
        self.bin_dir.mkdir(parents=True)
        Path("/run/sshd").mkdir(exist_ok=True)   # sshd's privilege-separation directory
        host_key, client_key = self.ssh_dir / "host_key", self.ssh_dir / "client_key"
        for key in (host_key, client_key):
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        shutil.copy(f"{client_key}.pub", self.ssh_dir / "authorized_keys")
        client_config = self.ssh_dir / "ssh_config"
        client_config.write_text(textwrap.dedent(f"""\
            Host *
              IdentityFile {client_key}
              IdentitiesOnly yes
              UserKnownHostsFile /dev/null
              StrictHostKeyChecking no
              LogLevel ERROR
              BatchMode yes
              ConnectTimeout 10
            """))
        wrapper = self.bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {client_config} "$@"\n')
        wrapper.chmod(0o755)
        for host, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            config = self.ssh_dir / f"sshd_{ns}"
            config.write_text(textwrap.dedent(f"""\
                ListenAddress {address}
                HostKey {host_key}
                AuthorizedKeysFile {self.ssh_dir}/authorized_keys
                PidFile {self.ssh_dir}/sshd_{ns}.pid
                PermitRootLogin prohibit-password
                PasswordAuthentication no
                StrictModes no
                UsePAM no
                AcceptEnv *
                """))
            _sh(*self.inside(host), SSHD, "-f", str(config), "-E",
                str(self.ssh_dir / f"sshd_{ns}.log"))
        # Ready when every host answers over SSH from the first host.
        deadline = time.monotonic() + 20
        for name in self.names:
            while True:
                probe = self.run([str(wrapper), name, "true"], timeout=15, check=False)
                if probe.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {name} did not answer: {probe.stdout}")
                time.sleep(0.2)

    @contextlib.contextmanager
    def more_names(self, names: dict[str, int]) -> Iterator[None]:
        """Within the block, each of ``names`` also resolves, on every host, to the address of
        host ``names[name]`` (0-based), as a Kubernetes headless service names its pods."""
        good = self.hosts_file.read_text()
        self.hosts_file.write_text(good + "".join(
            f"{self.addresses[host]} {name}\n" for name, host in names.items()))
        try:
            yield
        finally:
            self.hosts_file.write_text(good)

    def listeners(self) -> set[tuple[str, str, str]]:
        """What listens for TCP on every host now: (host name, address:port, process)."""
        found = set()
        for name, ns in zip(self.names, self.namespaces):
            table = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnpH"],
                                   capture_output=True, text=True).stdout
            for row in table.splitlines():
                process = ",".join(sorted(set(re.findall(r'\("([^"]+)"', row)))) or "?"
                found.add((name, row.split()[3], process))
        return found

    @contextlib.contextmanager
    def watching_listeners(self, every_s: float = 0.2) -> Iterator[set[tuple[str, str, str]]]:
        """Within the block, the listeners seen on any host (``listeners``), sampled by a thread
        every ``every_s``; the set is complete once the block ends."""
        seen: set[tuple[str, str, str]] = set()
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                seen.update(self.listeners())
                stop.wait(every_s)

        watcher = threading.Thread(target=sample, daemon=True)
        watcher.start()
        try:
            yield seen
        finally:
            stop.set()
            watcher.join()

    # ------------------------------------------------------------------------------------------
    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with this cluster's ``ssh`` first on PATH (launchers call plain ``ssh``)."""
        return {**base, "PATH": f"{self.bin_dir}{os.pathsep}{base.get('PATH', '')}"}

    def run(self, argv: list[str], *, host: int = 0, env: dict[str, str] | None = None,
            timeout: float = 300, check: bool = True, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess:
        """Runs ``argv`` on host ``host`` (by default the first: where launchers start), in a
        session of its own: at ``timeout`` the command and everything it started are killed."""
        with subprocess.Popen([*self.inside(host), *argv], env=env, cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL, start_new_session=True) as running:
            try:
                output, _ = running.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(running.pid, signal.SIGKILL)  # the command and all it started
                raise
        proc = subprocess.CompletedProcess(running.args, running.returncode, output)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{argv} failed ({proc.returncode}):\n{proc.stdout}")
        return proc

    def close(self) -> None:
        """Kills whatever runs in the namespaces and deletes them, and their links."""
        for ns in [*self.namespaces, self.switch]:
            _delete_namespace(ns)
        for link in leftovers(self.tag):   # a veth pair made, then interrupted before moving
            subprocess.run(["ip", "link", "del", link], capture_output=True)
