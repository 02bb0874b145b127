"""Start-up memory of the initial Gaussians per rank: the whole draw against a sharded rank's block.

Each case runs in its own process (``ru_maxrss`` is a process's peak): it imports everything,
reads its resident set, draws ``--num-random`` random Gaussians at SH degree 3
(``gaussians/initial.py:initial_gaussians``), and reports the peak above that resident set, with
the draw's wall time. Cases:

- ``whole``: one process, or every replicated rank (all N);
- ``whole_then_block``: what a sharded rank did before it drew only its block -- the whole draw,
  then a copy of its ``owned_block`` (tests/helpers/model_factory.py:take_initial_shard_ still does
  it for the tests that compare a shard with the whole model);
- ``block_wW``: rank 0 of W sharded ranks, drawing only its block (``shard=(0, W)``).

Ratios are taken within one run of this script. Usage::

    python -m benchmarks.bench_initial_draw --num-random 2000000 --worlds 2 8
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, child_env, finish_machine_record, machine_record, run_command, write_json


def _resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(case: str, num: int, world: int) -> dict:
    """One case in this process: the peak resident bytes above the set-up's, and the wall time."""
    import torch
    from nerfstudio.models.splatfacto import SplatfactoModelConfig

    from distsplat_ns.gaussians.initial import initial_gaussians
    from distsplat_ns.gaussians.ownership import owned_block

    config = SplatfactoModelConfig(random_init=True, num_random=num, sh_degree=3)
    torch.manual_seed(0)
    before = _resident_bytes()
    if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > before + (64 << 20):
        raise RuntimeError("the set-up's peak is above its resident set: the draw's peak would be hidden")
    start = time.perf_counter()
    if case == "whole":
        drawn = initial_gaussians(config, None)
    elif case == "whole_then_block":
        drawn = initial_gaussians(config, None)
        lo, hi = owned_block(num, 0, world)
        drawn = {k: v.data[lo:hi].clone() for k, v in drawn.params.items()}
    else:
        drawn = initial_gaussians(config, None, shard=(0, world))
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del drawn
    return {
        "case": case,
        "world": world,
        "num": num,
        "peak_above_setup_bytes": peak - before,
        "peak_bytes_per_gaussian": (peak - before) / num,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-random", type=int, default=2_000_000)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--out", type=Path, default=RESULTS / "initial_draw.json")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "NUM", "WORLD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    cases = [("whole", 1)] + [(c, w) for w in args.worlds for c in ("whole_then_block", f"block_w{w}")]
    machine = machine_record()
    runs = []
    for case, world in cases:
        cmd = [sys.executable, "-m", "benchmarks.bench_initial_draw", "--child", case, str(args.num_random), str(world)]
        out = run_command(cmd, name=f"{case} W={world}", env=child_env(threads=None))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(
            f"{case:>18} W={world}: {runs[-1]['peak_above_setup_bytes'] / 2**20:8.1f} MiB above set-up "
            f"({runs[-1]['peak_bytes_per_gaussian']:.1f} B per Gaussian), {runs[-1]['wall_s']:.2f} s",
            flush=True,
        )
    whole = runs[0]["peak_above_setup_bytes"]
    result = {
        "command": " ".join(["python -m benchmarks.bench_initial_draw", *sys.argv[1:]]),
        "num_random": args.num_random,
        "sh_degree": 3,
        "machine": finish_machine_record(machine),
        "runs": runs,
        "peak_over_whole": {f"{r['case']}_w{r['world']}": r["peak_above_setup_bytes"] / whole for r in runs},
    }
    write_json(args.out, result)
    print(json.dumps(result["peak_over_whole"], indent=2))


if __name__ == "__main__":
    main()
