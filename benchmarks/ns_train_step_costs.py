"""ns-train that records, on rank 0, every step's gathered balance figures (for
``bench_shard_balance.py``).

Usage (under torchrun): ``ns_train_step_costs.py <ns-train arguments>``. Environment:

- ``DISTSPLAT_STEP_COSTS_OUT``: the JSON file rank 0 writes at exit: per step, each rank's render
  time (forward + backward, s), its measured tile work (the sum of its bands' row costs) and its
  number of bands, as every rank has them after the step's cost gather.
- ``DISTSPLAT_SHARD_BOUND`` (optional): the sharded mode's rebalance bound for this run
  (``parallel/shard_rows.py:SHARD_BOUND`` otherwise).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    out = os.environ.get("DISTSPLAT_STEP_COSTS_OUT")
    if not out:
        raise SystemExit("error: ns_train_step_costs.py needs DISTSPLAT_STEP_COSTS_OUT, the JSON file to write")
    from nerfstudio.scripts.train import entrypoint

    from distsplat_ns import pipeline
    from distsplat_ns.parallel import sharded

    bound = os.environ.get("DISTSPLAT_SHARD_BOUND")
    if bound is not None:
        sharded.rebalance_shards_ = functools.partial(sharded.rebalance_shards_, bound=float(bound))
    steps: list[dict] = []
    observe = pipeline.DistSplatPipeline._observe_costs

    def recording(self, plan, batch, costs, view, clock):
        steps.append(
            {
                "render_s": list(costs.render_s),
                "work": [sum(sum(row_costs) for _, _, row_costs in bands) for bands in costs.measured],
                "bands": [len(bands) for bands in costs.measured],
            }
        )
        return observe(self, plan, batch, costs, view, clock)

    pipeline.DistSplatPipeline._observe_costs = recording

    def write() -> None:
        if os.environ.get("RANK", "0") == "0":
            Path(out).write_text(json.dumps(steps))

    atexit.register(write)
    sys.argv = ["ns-train", *sys.argv[1:]]
    entrypoint()


if __name__ == "__main__":
    main()
