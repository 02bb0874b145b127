"""Rank functions of the host-store tests (module level: they are pickled into spawned ranks)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

STORE_NAME = "train images"
MEMFD_PREFIX = "memfd:distsplat "


def memfd_inodes(pid: int | str = "self", name: str = STORE_NAME) -> set[int]:
    """Inodes of the ``memfd:distsplat <name>`` files that process ``pid`` holds open or maps."""
    inodes: set[int] = set()
    proc = Path(f"/proc/{pid}")
    try:
        for fd in (proc / "fd").iterdir():
            try:
                if os.readlink(fd).startswith(f"{MEMFD_PREFIX}{name}"):
                    inodes.add(os.stat(fd).st_ino)
            except OSError:
                continue
        for line in (proc / "maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(f"/{MEMFD_PREFIX}{name}"):
                inodes.add(int(fields[4]))
    except OSError:
        pass
    return inodes


def write_report(path: str, content: dict) -> None:
    """``content`` as JSON at ``path``, whole or not at all: other processes poll for the file and
    read it as soon as it exists (a plain write lets them read it empty)."""
    import json

    Path(f"{path}.partial").write_text(json.dumps(content))
    os.replace(f"{path}.partial", path)


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def shared_store_rank(ctx: Any, paths: list[str], budgets: list[int], host_of_rank: list[str] | None = None) -> dict:
    """Build the train store of ``paths`` with this rank's budget ``budgets[rank]``, grouped by
    host key (``host_of_rank[rank]``, or the real host key), and report what this rank sees."""
    from distsplat_ns.data.store import EncodedImageStore
    from distsplat_ns.distributed.host_share import HostGroup

    handler = _Messages()
    logging.getLogger("distsplat_ns").addHandler(handler)
    host = HostGroup(ctx, key=None if host_of_rank is None else host_of_rank[ctx.rank])
    store = EncodedImageStore(paths, budgets[ctx.rank], name=STORE_NAME, host=host)
    filled = store.wait_filled(60.0)
    exact = all(bytes(store.view(i)) == Path(p).read_bytes() for i, p in enumerate(paths))
    writable = None
    if store._buffer is not None:
        try:
            store._buffer.array[0] = store._buffer.array[0]
            writable = True
        except ValueError:
            writable = False
    inodes = memfd_inodes()
    result = {
        "rank": ctx.rank,
        "leader": host.leader_rank,
        "num_local_ranks": host.num_local_ranks,
        "is_filler": store.is_filler,
        "disk_mode": store.disk_mode,
        "budget_bytes": store.budget_bytes,
        "filled": filled,
        "exact": exact,
        "writable": writable,
        "inodes": sorted(inodes),
        "disk_mode_logged": sum("DISK MODE" in m for m in handler.messages),
    }
    from distsplat_ns.distributed.collectives import barrier

    barrier(ctx)  # every rank has looked before the leader's store may go
    return result


def shared_datamanager_rank(ctx: Any, scene: str) -> dict:
    """A datamanager with 1 forkserver worker per rank on ``scene`` (nerfstudio-data): its stats,
    the store's inode here and in the worker, and the first batch's pixels."""
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
    from distsplat_ns.distributed.collectives import barrier

    config = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=Path(scene), load_3D_points=False), num_workers=1, eval_num_workers=0
    )
    manager = config.setup(device="cpu", world_size=ctx.world_size, local_rank=ctx.local_rank, dist_ctx=ctx)
    manager.configure_training(4, ctx.rank, ctx.world_size)
    batch = manager.next_train_batch(0)
    workers = [w.pid for w in manager._reader._iterator._workers]  # type: ignore[union-attr]
    loader = manager._train_loader
    decoded = [
        loader.load(i)[0].numpy().tobytes() == image.numpy().tobytes()
        for i, image in zip(batch.camera_indices, batch.images, strict=True)
    ]
    result = {
        "stats": {k: v for k, v in manager.stats().items() if k.startswith("store") or k == "disk_mode"},
        "inodes": sorted(memfd_inodes()),
        "worker_inodes": [sorted(memfd_inodes(pid)) for pid in workers],
        "exact": all(decoded) and len(decoded) > 0,
    }
    barrier(ctx)
    manager.close()
    return result


def slow_fill_rank(ctx: Any, paths: list[str], report: str, seconds_per_file: float) -> None:
    """The host store with a fill of ``seconds_per_file`` per file; writes what it sees to
    ``report``.<rank> (pid, filler, inode), then keeps reading every entry until it is killed or,
    on a rank that outlives the filler, until every entry read back exactly once the filler is
    gone ("done" in the report), then exits without any collective."""
    import json

    from distsplat_ns.data import store as store_module
    from distsplat_ns.distributed.host_share import HostGroup
    from distsplat_ns.utils.shm import _alive  # a SIGKILLed rank is a zombie until its parent reaps it

    original = store_module.EncodedImageStore._fill

    def slow_fill(self) -> None:
        real_publish = self._publish

        def publish(count: int, state: int) -> None:
            time.sleep(seconds_per_file)
            real_publish(count, state)

        self._publish = publish
        original(self)

    store_module.EncodedImageStore._fill = slow_fill
    host = HostGroup(ctx)
    store = store_module.EncodedImageStore(paths, 1 << 30, name=STORE_NAME, host=host)
    write_report(
        f"{report}.{ctx.rank}", {"pid": os.getpid(), "is_filler": store.is_filler, "inodes": sorted(memfd_inodes())}
    )
    filler_pid = None
    while True:
        exact = all(bytes(store.view(i)) == Path(p).read_bytes() for i, p in enumerate(paths))
        if not store.is_filler:
            if filler_pid is None:
                others = [
                    json.loads(Path(f"{report}.{r}").read_text()) for r in host.ranks if Path(f"{report}.{r}").exists()
                ]
                filler_pid = next((o["pid"] for o in others if o["is_filler"]), None)
            if filler_pid is not None and not _alive(filler_pid):
                count = store.num_filled()
                exact = all(bytes(store.view(i)) == Path(p).read_bytes() for i, p in enumerate(paths))
                write_report(f"{report}.{ctx.rank}.done", {"exact": exact, "num_filled": count})
                os._exit(0)
        time.sleep(0.05)
