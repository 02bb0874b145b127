"""Two "hosts" on one machine: Linux network namespaces joined by a veth pair (root only).

Each namespace has its own loopback, one veth end and an address on a private /24 of its own
(``10.77.<k>.0/24``, ``k`` from the test process's pid, so parallel tests do not collide); traffic
stays between the two. The machine's hostname resolves to 127.0.0.1 in both, as on many cluster
images. :meth:`TwoHosts.cut` takes the link down (a partition), :meth:`TwoHosts.kill` SIGKILLs
everything in one namespace (a dead host), :meth:`TwoHosts.close` kills what is left and deletes
both namespaces.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class TwoHosts:
    """Namespaces ``names[i]`` with veth ``links[i]`` at ``addresses[i]``."""

    names: list[str]
    links: list[str]
    addresses: list[str]
    created: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, tag: str, tcp_retries2: int | None = None) -> TwoHosts:
        """Make both namespaces; raises ``PermissionError`` with ip's message where it is refused.

        ``tcp_retries2``: the namespaces' ``net.ipv4.tcp_retries2`` (None: the kernel's default,
        15, about 925 s before a connection to a lost host fails)."""
        k = 10 + (os.getpid() + sum(map(ord, tag))) % 240
        base = f"ds{os.getpid() % 100000}{tag}"[:11]
        hosts = cls(
            names=[f"{base}a", f"{base}b"], links=[f"{base}va", f"{base}vb"], addresses=[f"10.77.{k}.1", f"10.77.{k}.2"]
        )
        try:
            for name in hosts.names:
                proc = _ip("netns", "add", name, check=False)
                if proc.returncode != 0:
                    raise PermissionError(f"ip netns add {name}: {proc.stderr.strip()}")
                hosts.created.append(name)
            _ip("link", "add", hosts.links[0], "type", "veth", "peer", "name", hosts.links[1])
            for name, link, address in zip(hosts.names, hosts.links, hosts.addresses, strict=False):
                _ip("link", "set", link, "netns", name)
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "link", "set", link, "up")
                if tcp_retries2 is not None:
                    _ip("netns", "exec", name, "sysctl", "-q", "-w", f"net.ipv4.tcp_retries2={tcp_retries2}")
        except BaseException:
            hosts.close()
            raise
        return hosts

    def popen(self, host: int, cmd: Sequence[str], env: dict, log_path: str) -> subprocess.Popen:
        """``cmd`` in namespace ``host``, in a session of its own, output to ``log_path``."""
        log = open(log_path, "w")  # noqa: SIM115 -- closed with the process by the caller's wait
        return subprocess.Popen(
            ["ip", "netns", "exec", self.names[host], *cmd],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )

    def pids(self, host: int) -> list[int]:
        proc = _ip("netns", "pids", self.names[host], check=False)
        return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []

    def cut(self) -> None:
        """Take the link down on both ends: neither host reaches the other; both stay up."""
        for name, link in zip(self.names, self.links, strict=False):
            _ip("-n", name, "link", "set", link, "down")

    def kill(self, host: int) -> None:
        """SIGKILL every process in namespace ``host``."""
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for host in range(len(self.created)):
            self.kill(host)
        for name in self.created:
            _ip("netns", "del", name, check=False)
        self.created.clear()
