"""ns-train whose full evaluation (rank 0's own work) first sleeps a fixed time: a slow eval set made
deterministic, without a large one.

Usage (plain or under torchrun): ``ns_train_slow_eval.py SECONDS <ns-train arguments>``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from distsplat_ns.pipeline import DistSplatPipeline
    from distsplat_ns.utils.logging import get_logger

    delay_s = float(sys.argv[1])
    del sys.argv[1:2]
    logger = get_logger("ns_train_slow_eval")
    original = DistSplatPipeline.get_average_eval_image_metrics

    def slow(self, *args, **kwargs):
        logger.warning("test hook: the full evaluation sleeps %.0f s first", delay_s)
        time.sleep(delay_s)
        return original(self, *args, **kwargs)

    DistSplatPipeline.get_average_eval_image_metrics = slow
    from nerfstudio.scripts.train import entrypoint

    entrypoint()


if __name__ == "__main__":
    main()
