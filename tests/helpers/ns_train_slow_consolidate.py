"""ns-train whose params-only consolidation of a sharded run's last checkpoint (rank 0's own work)
first sleeps a fixed time: a scene too large to consolidate quickly, made deterministic. It also
logs how many parameters of the process's models still hold a gradient at that moment.

Usage (under torchrun): ``ns_train_slow_consolidate.py SECONDS <ns-train arguments>``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    # Patched where it is defined, before the trainer (or whichever module writes the end of a
    # run) imports the name, so the hook holds wherever that code lives.
    from distsplat_ns.parallel import shard_checkpoint
    from distsplat_ns.utils.logging import get_logger

    delay_s = float(sys.argv[1])
    del sys.argv[1:2]
    logger = get_logger("ns_train_slow_consolidate")
    original = shard_checkpoint.consolidate_params

    def slow(*args, **kwargs):
        import gc

        from distsplat_ns.model.distsplat_model import DistSplatModel

        models = [o for o in gc.get_objects() if isinstance(o, DistSplatModel)]
        held = sum(1 for model in models for p in model.parameters() if p.grad is not None)
        logger.warning("test hook: %d parameters of %d models hold gradients at the consolidation", held, len(models))
        logger.warning("test hook: the consolidation sleeps %.0f s first", delay_s)
        time.sleep(delay_s)
        return original(*args, **kwargs)

    shard_checkpoint.consolidate_params = slow
    from nerfstudio.scripts.train import entrypoint

    entrypoint()


if __name__ == "__main__":
    main()
