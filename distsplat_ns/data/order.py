"""Which images each training step uses, and which of them each rank decodes.

Pure: numpy only. Every function is a deterministic function of its arguments, so every rank (and
worker) computes the same global batch for a step without communicating: epoch ``e`` is the
permutation drawn from ``(seed, e)``, the epochs are concatenated, and step ``t`` takes positions
``[t * B, (t + 1) * B)``; resuming at step ``t`` needs no state but ``t`` (docs/data.md, "Sampling
and sharding").
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from distsplat_ns.utils.validation import check_int


@lru_cache(maxsize=8)
def _epoch_permutation(seed: int, num_images: int, epoch: int) -> np.ndarray:
    # SeedSequence mixes the (seed, epoch) pair; the result is the same on every platform and
    # numpy version that keeps PCG64 (the default bit generator since numpy 1.17).
    permutation = np.random.default_rng([seed, epoch]).permutation(num_images)
    permutation.flags.writeable = False
    return permutation


def epoch_permutation(seed: int, num_images: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` visits the images.

    Args:
        seed: Sampling seed (non-negative).
        num_images: Number of training images (> 0).
        epoch: 0-based epoch.

    Returns:
        A permutation of ``range(num_images)``. `[num_images]`, int64, read-only. Cached: the last
        few epochs are kept, so consecutive steps cost O(B) amortised.
    """
    check_int("seed", seed, 0)
    check_int("num_images", num_images, 1)
    check_int("epoch", epoch, 0)
    return _epoch_permutation(int(seed), int(num_images), int(epoch))


def batch_camera_ids(seed: int, num_images: int, batch_size: int, step: int) -> list[int]:
    """The global batch of camera (dataset) indices for one training step.

    Args:
        seed: Sampling seed (non-negative).
        num_images: Number of training images (> 0).
        batch_size: Images per step across all ranks, ``B`` (> 0).
        step: 0-based training step.

    Returns:
        ``B`` dataset indices: positions ``[step * B, (step + 1) * B)`` of the concatenation of the
        per-epoch permutations.

    Invariants:
        Identical on every rank and worker for the same arguments. Over any run of steps covering
        whole epochs, every index appears exactly once per epoch. If ``B > num_images`` a batch
        holds some image twice (from consecutive epochs).
    """
    check_int("batch_size", batch_size, 1)
    check_int("step", step, 0)
    check_int("num_images", num_images, 1)
    first = step * batch_size
    ids: list[int] = []
    position = first
    end = first + batch_size
    while position < end:
        epoch, offset = divmod(position, num_images)
        permutation = epoch_permutation(seed, num_images, epoch)
        take = min(end - position, num_images - offset)
        ids.extend(int(i) for i in permutation[offset : offset + take])
        position += take
    return ids


def contiguous_split(batch_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """The contiguous range of batch positions that rank ``rank`` handles.

    The first ``batch_size % world_size`` ranks get one extra position. With
    ``batch_size < world_size`` the ranks ``>= batch_size`` get an empty range.

    Args:
        batch_size: Images per step across all ranks (> 0).
        world_size: Number of processes (> 0).
        rank: Global process index in ``[0, world_size)``.

    Returns:
        ``(start, end)`` with ``start <= end``: positions ``start .. end - 1`` of the global batch.
    """
    check_int("batch_size", batch_size, 1)
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    base, remainder = divmod(batch_size, world_size)
    start = rank * base + min(rank, remainder)
    end = start + base + (1 if rank < remainder else 0)
    return start, end


class ContiguousAssigner:
    """The default split of each global batch across ranks: contiguous, whole images.

    The interface the pipeline may replace (e.g. by a load balancer): an object, picklable (it is
    sent to DataLoader workers), with ``positions_for_rank(step, batch, rank, world_size)``. It
    must be a pure function of its arguments, so that every rank and worker agrees.
    """

    def positions_for_rank(self, step: int, batch: list[int], rank: int, world_size: int) -> list[int]:
        """Positions of ``batch`` whose images rank ``rank`` must have decoded at step ``step``.

        Args:
            step: 0-based training step (unused by this split; load balancers may use it).
            batch: The global batch of dataset indices (``batch_camera_ids``).
            rank: Global process index.
            world_size: Number of processes.

        Returns:
            Increasing positions into ``batch``.
        """
        del step
        start, end = contiguous_split(len(batch), world_size, rank)
        return list(range(start, end))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __repr__(self) -> str:
        return "ContiguousAssigner()"
