"""The ranks of one host, found through the process group, and what their leader shares with them.

Each host keeps one encoded-image store for all its local ranks (``data/store.py``). Ranks with the
same ``host_key()`` (boot id and network-namespace inode) share a host, found by one all-gather
without trusting ``LOCAL_RANK``; the lowest is the leader, which decides, fills the store and serves
its descriptors over an abstract Unix socket (``utils/fd_passing.py``), so nothing is named in the
file system. Why: docs/data.md, "One store per host".
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from distsplat_ns.distributed.collectives import all_gather_object
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.utils.errors import RunFailure
from distsplat_ns.utils.fd_passing import FdServer, receive_fds
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_NET_NAMESPACE = "/proc/self/ns/net"


def host_key() -> str:
    """What identifies this process's host: boot id and network namespace (hostname without procfs)."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
        return f"{boot}/net:{os.stat(_NET_NAMESPACE).st_ino}"
    except OSError:
        return f"host:{socket.gethostname()}"


def local_ranks(keys: Sequence[str], rank: int) -> list[int]:
    """The ranks whose key is ``rank``'s, in increasing order (``rank`` included; the first leads)."""
    return [r for r, key in enumerate(keys) if key == keys[rank]]


class HostGroup:
    """The local ranks of this rank's host (``data/store.HostShare``).

    Args:
        ctx: The process context.
        key: This rank's host key (``host_key()`` when None; tests group ranks as they like).

    Attributes:
        ranks: The global ranks on this host, increasing.
        leader_rank: ``ranks[0]``: it fills the host's stores and decides for the host.
        is_leader: Whether this rank leads.
        num_local_ranks: ``len(ranks)``.
        num_hosts: Hosts in the job.

    **Collective** (construction): world group, one all-gather of the host keys; every rank
    builds its group at the same point. Alone (``world_size == 1``): a group of one, no collective.
    """

    def __init__(self, ctx: DistContext, key: str | None = None) -> None:
        self.ctx = ctx
        keys = all_gather_object(ctx, key if key is not None else host_key())
        self.ranks = local_ranks(keys, ctx.rank)
        self.leader_rank = self.ranks[0]
        self.is_leader = ctx.rank == self.leader_rank
        self.num_local_ranks = len(self.ranks)
        self.num_hosts = len(set(keys))

    def share(self, make: Callable[[], tuple[Any, list[int]]]) -> tuple[Any, list[int]]:
        """The leader runs ``make() -> (info, fds)``; every local rank returns ``info`` and
        descriptors of the same files (the leader its own; the others received copies, which
        they own, read-only as the leader opened them).

        Raises:
            RunFailure: On the other local ranks: the leader's ``make`` failed (its message), or
                its descriptors could not be received (its process ended, or no answer within
                the collective timeout). The leader re-raises its own error.

        **Collective:** world group, one all-gather (the leader's answer; the other ranks send
        None), every rank in the same order. Rank 0 leading host A with rank 1, rank 2 leading
        host B: ranks 0 and 2 run ``make``, rank 1 receives rank 0's descriptors, every rank
        takes part in the one all-gather.
        """
        ctx = self.ctx
        if self.is_leader:
            try:
                info, fds = make()
            except BaseException as err:
                all_gather_object(ctx, ("error", f"{type(err).__name__}: {err}", None, 0))
                raise
            server = (
                FdServer(fds, self.num_local_ranks - 1, ctx.timeout_s) if fds and self.num_local_ranks > 1 else None
            )
            all_gather_object(ctx, ("ok", info, server.address if server is not None else None, len(fds)))
            return info, fds
        status, info, address, num_fds = all_gather_object(ctx, None)[self.leader_rank]
        if status != "ok":
            raise RunFailure(
                f"rank {ctx.rank}: rank {self.leader_rank}, which leads this host's local ranks, failed: {info}"
            )
        if address is None:
            return info, []
        try:
            return info, receive_fds(address, num_fds, ctx.timeout_s)
        except OSError as err:
            raise RunFailure(
                f"rank {ctx.rank}: could not receive the shared image store from rank {self.leader_rank}, which leads "
                f"this host's local ranks ({type(err).__name__}: {err}); its process has probably ended"
            ) from err
