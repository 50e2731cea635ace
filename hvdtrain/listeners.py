"""Horovod's own listeners bound to the training interface the user named, not to every
interface of the host.

horovodrun's Gloo rendezvous (an HTTP server) and its driver and task services, and under
elastic training each worker's notification service, take their port from
``horovod.runner.util.network.find_port``, which binds ``('', port)``: every interface, a
management or public network included, although ``--network-interface`` named one. Here
find_port binds to that interface's IPv4 address instead; Horovod already advertises that
address alone to its peers (its services' ``nics``, the rendezvous address), so nothing else
changes. Gloo's rank-to-rank sockets bind to ``HOROVOD_GLOO_IFACE``'s address by themselves.

    python -m hvdtrain.listeners horovodrun ARGS    # horovodrun ARGS, bound to ARGS' interface
    python -m hvdtrain.listeners [PATH/]hvdtrain ARGS   # a rank: bound to HOROVOD_GLOO_IFACE's

This imports Horovod's launcher (horovod.runner: pure Python, no TensorFlow), never its
TensorFlow ops, which stay behind hvdtrain/distributed/: a launch must not pay for TensorFlow.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Callable, Sequence

from hvdtrain.errors import UserError

INTERFACE_FLAGS = ("--network-interface", "--network-interfaces")
# Horovod: the variable horovodrun sets in every rank from --network-interface.
GLOO_IFACE = "HOROVOD_GLOO_IFACE"


def interface_address(interface: str) -> str:
    """The IPv4 address of ``interface`` on this host; UserError when it has none."""
    import psutil  # type: ignore[import-untyped]  # Horovod's dependency; lists interfaces
    found = [a.address for a in psutil.net_if_addrs().get(interface, [])
             if a.family == socket.AF_INET]
    if not found:
        raise UserError(f"network interface {interface!r} has no IPv4 address on "
                        f"{socket.gethostname()}: name the training network's interface")
    return found[0]


def named_interface(argv: Sequence[str]) -> str | None:
    """The one interface horovodrun's ``argv`` names (``--network-interface IF``), or None
    where it names none or several (then Horovod's own binding stays)."""
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in INTERFACE_FLAGS:
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return value if value and "," not in value else None
    return None


def bind_to(interface: str) -> str:
    """Makes every listener Horovod's launcher code starts in this process bind to
    ``interface``'s address; returns that address."""
    address = interface_address(interface)
    # Horovod: its services and its HTTP servers imported find_port by name; each gets ours.
    from horovod.runner.common.util import network as services
    from horovod.runner.http import http_server
    from horovod.runner.util import network

    def bound(server_factory: Callable) -> tuple:
        return network.find_port(lambda any_address: server_factory((address, any_address[1])))

    services.find_port = bound
    http_server.find_port = bound
    return address


def main(argv: Sequence[str] | None = None) -> None:
    """``horovodrun ARGS`` or ``hvdtrain ARGS`` with Horovod's listeners bound as named."""
    program, *args = list(sys.argv[1:] if argv is None else argv) or [""]
    name = os.path.basename(program)   # hvdtrain may come by its path
    if name not in ("horovodrun", "hvdtrain"):
        sys.exit("usage: python -m hvdtrain.listeners horovodrun|hvdtrain ARGS")
    interface = named_interface(args) if name == "horovodrun" else os.environ.get(GLOO_IFACE)
    try:
        if interface and "," not in interface:
            bind_to(interface)
    except UserError as e:
        print(f"hvdtrain: error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    sys.argv = [program, *args]
    if name == "hvdtrain":
        from hvdtrain import cli
        cli.main()
    # Horovod: its own launcher, which reads sys.argv.
    from horovod.runner.launch import run_commandline
    sys.exit(run_commandline())


if __name__ == "__main__":
    main()
