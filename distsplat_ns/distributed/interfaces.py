"""Which network interface the process group's sockets use on a host of a multi-host run.

gloo (and NCCL's bootstrap) bind to the address this host's name resolves to unless
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name an interface. On many cluster images (and in
network namespaces sharing one hostname) the name resolves to 127.0.0.1: the other hosts are then
told to connect to their own loopback, and the start-up hangs for minutes before a raw "Connect
timeout" (docs/distributed.md, "Faults across hosts"). :func:`choose_socket_interface` picks, in that case only, the interface whose
route reaches the rendezvous address (``MASTER_ADDR``), says so in one line, and fails in seconds
naming the variable when no interface does.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil

from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)


def socket_variables(backend: str) -> tuple:
    """The interface variables the backend's sockets read: gloo's, and under NCCL both (the
    lifecycle's host-side flags run on a gloo twin of the NCCL group)."""
    return ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if backend == "nccl" else ("GLOO_SOCKET_IFNAME",)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _resolve(name: str) -> str | None:
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return None


def route_source_address(destination: str, port: int) -> str | None:
    """The local IPv4 address the kernel routes ``destination`` from (a UDP ``connect`` sends nothing)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((destination, port))
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


def interface_of(address: str) -> str | None:
    """The interface holding IPv4 ``address``, or None."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    return None


def choose_socket_interface(backend: str, env: dict[str, str] | None = None) -> str | None:
    """Set the socket interface variable(s) in ``env`` (default ``os.environ``) when none is set,
    this host's name resolves to a loopback address and the rendezvous address does not.

    Returns:
        The interface chosen, or None when nothing needed choosing (a variable is set, a one-host
        run on loopback, or a hostname that resolves to a routable address).

    Raises:
        UserError: no interface routes to ``MASTER_ADDR``, naming the variable to set.
    """
    env = os.environ if env is None else env
    variables = socket_variables(backend)
    master = env.get("MASTER_ADDR")
    if not master or all(env.get(v) for v in variables):
        return None
    master_ip = _resolve(master)
    hostname = socket.gethostname()
    host_ip = _resolve(hostname)
    if master_ip is None or _is_loopback(master_ip) or (host_ip is not None and not _is_loopback(host_ip)):
        return None
    source = route_source_address(master_ip, int(env.get("MASTER_PORT", "29500") or 29500))
    name = interface_of(source) if source and not _is_loopback(source) else None
    missing = [v for v in variables if not env.get(v)]
    if name is None:
        raise UserError(
            f"this host's name {hostname!r} resolves to {host_ip or 'nothing'} and no interface routes to the rendezvous "
            f"address MASTER_ADDR={master} ({master_ip}): set {' and '.join(missing)} to the interface that reaches the other hosts"
        )
    for variable in missing:
        env[variable] = name
    LOGGER.info(
        "%s=%s: the interface routing to MASTER_ADDR %s (this host's name %r resolves to %s)",
        "/".join(missing),
        name,
        master,
        hostname,
        host_ip,
    )
    return name
