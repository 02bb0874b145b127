"""ns-train with a fault on one rank at one step (fault-injection runs): a NaN written into its
local gradient, or with ``DISTSPLAT_TEST_FAULT=raise`` an internal error (a RuntimeError).

Usage (plain or under torchrun): ``ns_train_with_fault.py STEP RANK <ns-train arguments>``. It sets
the pipeline's test hook (``distsplat_ns/pipeline.py``: ``before_gradient_sum_hook``) and then runs
nerfstudio's ``ns-train`` entry point in this process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import torch

    from distsplat_ns import pipeline
    from distsplat_ns.utils.logging import get_logger

    fault_step, fault_rank = int(sys.argv[1]), int(sys.argv[2])
    del sys.argv[1:3]
    logger = get_logger("ns_train_with_fault")

    def write_nan(step: int, rank: int, model) -> None:
        if step != fault_step or rank != fault_rank:
            return
        if os.environ.get("DISTSPLAT_TEST_FAULT") == "raise":
            raise RuntimeError(f"injected internal error at step {step}")
        logger.warning("fault injection: NaN written into the local gradient at step %d", step)
        if model.means.grad is None:
            model.means.grad = torch.zeros_like(model.means)
        model.means.grad.view(-1)[0] = float("nan")

    pipeline.before_gradient_sum_hook = write_nan
    from nerfstudio.scripts.train import entrypoint

    entrypoint()


if __name__ == "__main__":
    main()
