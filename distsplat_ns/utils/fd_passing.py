"""File descriptors handed from one process to unrelated ones on the same host, leaving nothing named.

Pure: the standard library (Linux).

The local ranks of a host share one encoded-image store (``data/store.py``; docs/data.md, "One store per host"): the rank
that fills it sends the store's memfd to the others. Under torchrun the local ranks are unrelated
processes (siblings), so the descriptor cannot be inherited; it travels over a Unix socket as
``SCM_RIGHTS`` ancillary data. The socket lives in the *abstract* namespace (a name starting with
NUL): it is no file, and the kernel removes the name when the socket closes -- also when its
process is SIGKILLed. The name is random (128 bits) and handed out through the process group
(``distributed/host_share.py``); a client of another user is refused (``SO_PEERCRED``).
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
import time

_MESSAGE = b"distsplat-fds"
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class FdServer:
    """Serves ``fds`` to ``num_clients`` connections on a fresh abstract Unix socket, from a daemon thread.

    Args:
        fds: Descriptors to send (each client receives its own copies). They stay owned by the
            caller, who must keep them open until the clients have received them.
        num_clients: Connections to serve before the socket closes.
        timeout_s: The socket closes after this long even if clients are missing (they then fail
            to connect, naming it).
        tag: Readable part of the socket's name (shows in ``ss -xl``).

    Attributes:
        address: The socket's abstract name (starts with NUL), for ``receive_fds``.
    """

    def __init__(self, fds: list[int], num_clients: int, timeout_s: float, tag: str = "store") -> None:
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.address = f"\0distsplat-{tag}-{os.getpid()}-{secrets.token_hex(16)}"
        self.num_served = 0
        self._fds = list(fds)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.bind(self.address)
            self._sock.listen(num_clients)
        except BaseException:
            self._sock.close()
            raise
        self._thread = threading.Thread(
            target=self._serve, args=(num_clients, timeout_s), name=f"serve {tag} fds", daemon=True
        )
        self._thread.start()

    def _serve(self, num_clients: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while self.num_served < num_clients:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._sock.settimeout(remaining)
                try:
                    conn, _ = self._sock.accept()
                except OSError:  # timed out, or closed
                    return
                with conn:
                    _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
                    if uid != os.getuid():
                        continue
                    try:
                        socket.send_fds(conn, [_MESSAGE], self._fds)
                    except OSError:  # the client went away: it reports its own failure
                        continue
                    self.num_served += 1
        finally:
            self._sock.close()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until every client was served or the socket closed; True when all were served."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def receive_fds(address: str, num_fds: int, timeout_s: float) -> list[int]:
    """Connect to an ``FdServer`` at ``address`` and receive its ``num_fds`` descriptors (close-on-exec).

    Raises:
        OSError: No server at ``address`` (its process ended: ``ConnectionRefusedError``), no
            answer within ``timeout_s``, or a message without the expected descriptors.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout_s)
        sock.connect(address)
        message, fds, _, _ = socket.recv_fds(sock, len(_MESSAGE), max(num_fds, 1), socket.MSG_CMSG_CLOEXEC)
        if message != _MESSAGE or len(fds) != num_fds:
            for fd in fds:
                os.close(fd)
            raise OSError(f"expected {num_fds} descriptors from {address[1:]!r}, got {len(fds)} (message {message!r})")
        return fds
