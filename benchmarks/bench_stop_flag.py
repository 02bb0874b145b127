"""Cost of agreeing on a stop after every step: ``any_rank_true`` on 2 gloo ranks.

The training loop calls ``distributed/lifecycle.py:any_rank_true`` once per step so that SIGINT or
SIGTERM on any rank stops every rank after the same step. This measures one call (a one-element
int all-reduce over gloo on host memory) and, in the same run, one gradient-sized all-reduce
(``--grad-mib``, the sum every step already does), and prints their ratio.

Usage::

    python benchmarks/bench_stop_flag.py --calls 2000 --grad-mib 8
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, calls: int, grad_mib: float, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from distsplat_ns.distributed.collectives import all_reduce_sum_
    from distsplat_ns.distributed.context import init_distributed, shutdown_distributed
    from distsplat_ns.distributed.lifecycle import any_rank_true

    ctx = init_distributed("cpu", timeout_s=120)
    grad = torch.zeros(int(grad_mib * 2**20 / 4))
    for _ in range(20):  # warm-up
        any_rank_true(ctx, False)
        all_reduce_sum_(ctx, grad)
    t0 = time.perf_counter()
    for _ in range(calls):
        any_rank_true(ctx, False)
    flag_s = (time.perf_counter() - t0) / calls
    grad_calls = max(10, calls // 50)
    t0 = time.perf_counter()
    for _ in range(grad_calls):
        all_reduce_sum_(ctx, grad)
    grad_s = (time.perf_counter() - t0) / grad_calls
    if rank == 0:
        queue.put({"stop_flag_us": flag_s * 1e6, "grad_allreduce_us": grad_s * 1e6, "grad_mib": grad_mib, "flag_over_grad": flag_s / grad_s})
    shutdown_distributed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--grad-mib", type=float, default=8.0)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, args.calls, args.grad_mib, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
