"""nerfstudio's ``ns-train`` entry point run in this process after named test patches.

Usage (plain or under torchrun): ``ns_train_patched.py PATCH=VALUE [PATCH=VALUE ...] <ns-train
arguments>``; the leading ``NAME=VALUE`` words (no leading dash) choose the patches, the rest goes
to ns-train. ``patched_ns_train`` (below) builds the word list for a test. The patches:

- ``fault=STEP,RANK``: a fault on rank RANK at step STEP, through the pipeline's test hook
  (``distsplat_ns/pipeline/distsplat_pipeline.py``: ``before_gradient_sum_hook``): a NaN written into its local
  gradient; with ``DISTSPLAT_TEST_FAULT=raise`` an internal error (a RuntimeError); with
  ``DISTSPLAT_TEST_FAULT=sigkill`` a SIGKILL of the rank itself (first torchrun attempt only, so
  a restart trains on); with ``DISTSPLAT_TEST_FAULT=hang`` a rank stuck outside any collective
  for ever.
- ``slow-eval=SECONDS``: the full evaluation (rank 0's own work) first sleeps SECONDS: a slow
  eval set made deterministic, without a large one.
- ``slow-consolidate=SECONDS``: the params-only consolidation of a sharded run's last checkpoint
  (rank 0's own work) first sleeps SECONDS: a scene too large to consolidate quickly, made
  deterministic. It also logs how many parameters of the process's models still hold a gradient
  at that moment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

SCRIPT = Path(__file__).resolve()


def patched_ns_train(*patches: str) -> list[str]:
    """The program words that replace ``ns-train`` (``nsrun.run_torchrun(program=...)``): this
    script and its ``NAME=VALUE`` patches, e.g. ``patched_ns_train("fault=12,1")``."""
    for spec in patches:
        _parse(spec)
    return [str(SCRIPT), *patches]


def _fault(value: str) -> None:
    import torch

    from distsplat_ns import pipeline
    from distsplat_ns.utils.logging import get_logger

    fault_step, fault_rank = (int(v) for v in value.split(","))
    logger = get_logger("ns_train_patched.fault")

    def write_nan(step: int, rank: int, model) -> None:
        if step != fault_step or rank != fault_rank:
            return
        if os.environ.get("DISTSPLAT_TEST_FAULT") == "hang":
            logger.warning("fault injection: this rank hangs at step %d", step)
            while True:
                time.sleep(60)
        if os.environ.get("DISTSPLAT_TEST_FAULT") == "sigkill":
            if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                logger.warning("fault injection: SIGKILL of this rank at step %d", step)
                os.kill(os.getpid(), signal.SIGKILL)
            return
        if os.environ.get("DISTSPLAT_TEST_FAULT") == "raise":
            raise RuntimeError(f"injected internal error at step {step}")
        logger.warning("fault injection: NaN written into the local gradient at step %d", step)
        if model.means.grad is None:
            model.means.grad = torch.zeros_like(model.means)
        model.means.grad.view(-1)[0] = float("nan")

    pipeline.before_gradient_sum_hook = write_nan


def _slow_eval(value: str) -> None:
    from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipeline
    from distsplat_ns.utils.logging import get_logger

    delay_s = float(value)
    logger = get_logger("ns_train_patched.slow_eval")
    original = DistSplatPipeline.get_average_eval_image_metrics

    def slow(self, *args, **kwargs):
        logger.warning("test hook: the full evaluation sleeps %.0f s first", delay_s)
        time.sleep(delay_s)
        return original(self, *args, **kwargs)

    DistSplatPipeline.get_average_eval_image_metrics = slow


def _slow_consolidate(value: str) -> None:
    # Patched where it is defined, before the trainer (or whichever module writes the end of a
    # run) imports the name, so the hook holds wherever that code lives.
    from distsplat_ns.parallel import shard_checkpoint
    from distsplat_ns.utils.logging import get_logger

    delay_s = float(value)
    logger = get_logger("ns_train_patched.slow_consolidate")
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


PATCHES: dict[str, Callable[[str], None]] = {
    "fault": _fault,
    "slow-eval": _slow_eval,
    "slow-consolidate": _slow_consolidate,
}


def _is_patch(word: str) -> bool:
    return "=" in word and not word.startswith("-")


def _parse(spec: str) -> tuple[Callable[[str], None], str]:
    name, _, value = spec.partition("=")
    if name not in PATCHES:
        raise SystemExit(f"ns_train_patched.py: unknown patch {name!r} in {spec!r} (known: {', '.join(PATCHES)})")
    return PATCHES[name], value


def main() -> None:
    specs = []
    while len(sys.argv) > 1 and _is_patch(sys.argv[1]):
        specs.append(sys.argv.pop(1))
    if not specs:
        raise SystemExit(
            f"ns_train_patched.py: no PATCH=VALUE before the ns-train arguments (known: {', '.join(PATCHES)})"
        )
    for install, value in [_parse(spec) for spec in specs]:
        install(value)
    from nerfstudio.scripts.train import entrypoint

    entrypoint()


if __name__ == "__main__":
    sys.path.insert(0, str(SCRIPT.parents[2]))  # run as a script: the repository's distsplat_ns first
    main()
