"""gsplat's compiled entry points on the CPU, for tests: :func:`installed` swaps gsplat's extension
object (``_C``, which gsplat's Python wrappers fetch at call time: ``_make_lazy_cuda_func`` in
``gsplat/cuda/_wrapper.py``, 1.4.0 to 1.5.3 alike) for :class:`CpuExtension`, whose entry points
compute on torch ops. gsplat's own Python code -- ``gsplat.rasterization``, ``fully_fused_projection``,
``isect_tiles``, ``rasterize_to_pixels``, ``spherical_harmonics``, ``relocation.compute_relocation``
and their autograd Functions -- then runs unchanged on CPU tensors and on the device stand-in's
(tests/helpers/device_standin.py, which turns this on too), forward and backward, so a wrong
argument order, shape or keyword in the package's calls into gsplat fails here as on a GPU.

The entry points: tests/helpers/gsplat_cpu_ops.py (projection, intersection, SH, relocation) and
tests/helpers/gsplat_cpu_raster.py (the compositor). What they cannot show (the kernels' numerics
and fast-math, memory, speed, streams, gsplat 1.5.3's JIT build): docs/gsplat_on_cpu.md.

Every entry point checks what the kernels' ``GSPLAT_CHECK_INPUT`` checks that the CPU can: its
tensors on one device, contiguous, and CUDA tensors wherever ``torch.cuda.is_available()``. It does not check their dtype (the kernels take float32 only;
the shim computes in the inputs' dtype, so the tests can use float64).
"""

from __future__ import annotations

import contextlib
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from tests.helpers import gsplat_cpu_ops as ops
from tests.helpers import gsplat_cpu_raster as raster

_BACKEND = "gsplat.cuda._backend"


class MissingEntryPoint(NotImplementedError):
    """An entry point of gsplat's extension that the CPU shim does not provide."""


def _checked(name: str, fn: Callable) -> Callable:
    """``fn`` behind the kernels' input checks (one device, contiguous)."""

    def entry(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        devices = sorted({str(t.device) for t in tensors})
        if len(devices) > 1:
            raise RuntimeError(f"gsplat CPU shim: {name}: inputs on {', '.join(devices)}; the kernel needs one device")
        if torch.cuda.is_available() and any(not t.is_cuda for t in tensors):
            # Where there is CUDA (the device stand-in says so too) the kernels take CUDA tensors only.
            raise RuntimeError(f"gsplat CPU shim: {name}: inputs on {devices[0]}; the kernel needs CUDA tensors")
        if not all(t.is_contiguous() for t in tensors):
            raise RuntimeError(f"gsplat CPU shim: {name}: an input is not contiguous (the kernel's check)")
        return fn(*args, **kwargs)

    entry.__name__ = name
    return entry


#: gsplat 1.4.0's entry points (the names ``gsplat/cuda/_wrapper.py`` and ``relocation.py`` fetch),
#: each with the kernel's own signature.
ENTRY_POINTS_1_4_0: dict[str, Callable] = {
    "fully_fused_projection_fwd": ops.projection_fwd,
    "fully_fused_projection_bwd": ops.projection_bwd,
    "fully_fused_projection_packed_fwd": ops.projection_packed_fwd,
    "fully_fused_projection_packed_bwd": ops.projection_packed_bwd,
    "isect_tiles": ops.isect_tiles,
    "isect_offset_encode": ops.isect_offset_encode,
    "rasterize_to_pixels_fwd": raster.rasterize_fwd,
    "rasterize_to_pixels_bwd": raster.rasterize_bwd,
    "compute_sh_fwd": ops.sh_fwd,
    "compute_sh_bwd": ops.sh_bwd,
    "compute_relocation": ops.relocation,
}

#: gsplat 1.5.0's: every entry point renamed (1.5.0's gsplat/cuda/ext.cpp, at the v1.5.0 tag: the 1.5.0 and
#: 1.5.1 wheels leave that file out); the projections take ``opacities`` (after ``scales``) and give per-axis
#: radii ``[C, N, 2]`` (3.33 sigma, tightened by opacity: csrc/ProjectionEWA3DGSFused.cu); ``intersect_tile``
#: takes those radii, no ``segmented`` (csrc/Intersect.cpp), and sign-extends the depth bits
#: (csrc/IntersectTile.cu); the packed projection gives no ``batch_ids`` (csrc/Projection.cpp) and its
#: backward has 1.4.0's signature (``_wrapper.py``'s ``_FullyFusedProjectionPacked.backward``). Same
#: signatures as 1.4.0's: offsets, compositor (same rules: csrc/RasterizeToPixels3DGSFwd.cu), SH, relocation.
ENTRY_POINTS_1_5_0: dict[str, Callable] = {
    "projection_ewa_3dgs_fused_fwd": ops.projection_fwd_153,
    "projection_ewa_3dgs_fused_bwd": ops.projection_bwd,
    "projection_ewa_3dgs_packed_fwd": ops.projection_packed_fwd_150,
    "projection_ewa_3dgs_packed_bwd": ops.projection_packed_bwd,
    "intersect_tile": ops.intersect_tile_150,
    "intersect_offset": ops.isect_offset_encode,
    "rasterize_to_pixels_3dgs_fwd": raster.rasterize_fwd,
    "rasterize_to_pixels_3dgs_bwd": raster.rasterize_bwd,
    "spherical_harmonics_fwd": ops.sh_fwd,
    "spherical_harmonics_bwd": ops.sh_bwd,
    "relocation": ops.relocation,
}

#: gsplat 1.5.1's and 1.5.2's: 1.5.0's, with the depth bits zero-extended in ``intersect_tile`` (1.5.1's
#: csrc/IntersectTile.cu). 1.5.2 changes nothing the package meets: it adds the unscented-transform and
#: from-world kernels, and drops 1.5.1's eigenvalue cap on the radii, which never changes them (see
#: gsplat_cpu_ops._opacity_radii; the shim's radii without ``opacities`` are each release's own reference's).
ENTRY_POINTS_1_5_1: dict[str, Callable] = {**ENTRY_POINTS_1_5_0, "intersect_tile": ops.intersect_tile_151}

#: gsplat 1.5.3's: 1.5.1's with batch dimensions ``[...]`` throughout: the packed projection gives
#: ``batch_ids`` (first, after ``indptr``) and its backward takes them; ``intersect_tile`` takes ``segmented``.
ENTRY_POINTS_1_5_3: dict[str, Callable] = {
    **ENTRY_POINTS_1_5_1,
    "projection_ewa_3dgs_packed_fwd": ops.projection_packed_fwd_153,
    "projection_ewa_3dgs_packed_bwd": ops.projection_packed_bwd_153,
    "intersect_tile": ops.intersect_tile_153,
}

#: The tables by release: the one place the releases' names and signatures differ.
ENTRY_POINTS: dict[tuple[int, int, int], dict[str, Callable]] = {
    (1, 4, 0): ENTRY_POINTS_1_4_0,
    (1, 5, 0): ENTRY_POINTS_1_5_0,
    (1, 5, 1): ENTRY_POINTS_1_5_1,
    (1, 5, 2): ENTRY_POINTS_1_5_1,
    (1, 5, 3): ENTRY_POINTS_1_5_3,
}

#: Values gsplat fetches with ``_make_lazy_cuda_obj``. Its loop takes every dotted part from ``_C``
#: itself (``CameraModelType.PINHOLE`` -> ``_C.PINHOLE``), which works on the extension because its
#: enums export their values into the module.
_VALUES: dict[str, Any] = {
    **ops.CAMERA_MODELS,
    "CameraModelType": types.SimpleNamespace(**ops.CAMERA_MODELS),
}


def entry_points(version: str) -> dict[str, Callable]:
    """The CPU entry points for gsplat ``version`` (``gsplat.__version__``).

    Raises:
        ValueError: a gsplat this shim was not written for.
    """
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    parsed = tuple(int(x) for x in match.groups()) if match else None
    if parsed in ENTRY_POINTS:
        return ENTRY_POINTS[parsed]
    known = ", ".join(".".join(map(str, v)) for v in ENTRY_POINTS)
    raise ValueError(f"gsplat CPU shim: gsplat {version} has no entry-point table ({known} have)")


class CpuExtension:
    """Stands for gsplat's compiled ``_C``: its entry points on torch ops; one it lacks raises
    :class:`MissingEntryPoint` naming it."""

    def __init__(self, version: str) -> None:
        self.version = version
        self._entries = {name: _checked(name, fn) for name, fn in entry_points(version).items()}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._entries:
            return self._entries[name]
        if name in _VALUES:
            return _VALUES[name]
        raise MissingEntryPoint(f"gsplat CPU shim: gsplat {self.version}'s entry point {name!r} has no CPU version")


@contextlib.contextmanager
def installed() -> Iterator[CpuExtension | None]:
    """While active, the installed gsplat's compiled entry points are :class:`CpuExtension`'s.

    gsplat's ``cuda/_backend.py`` builds (or JIT-compiles) the real extension when imported, so it is
    not imported here: when it is not loaded yet, a module of that name holding only ``_C`` stands in
    its place until the block ends; when it is, its ``_C`` is swapped and put back. Nesting and re-entry
    are harmless (each level restores what it found). Without gsplat it does nothing (yields None).
    """
    try:
        import gsplat
    except ImportError:
        yield None
        return
    extension = CpuExtension(gsplat.__version__)
    module = sys.modules.get(_BACKEND)
    if module is None:
        module = types.ModuleType(_BACKEND, "gsplat's compiled extension, on the CPU (tests/helpers/gsplat_cpu.py)")
        module._C = extension  # type: ignore[attr-defined]
        sys.modules[_BACKEND] = module
        try:
            yield extension
        finally:
            if sys.modules.get(_BACKEND) is module:
                del sys.modules[_BACKEND]
        return
    previous = getattr(module, "_C", None)
    module._C = extension  # type: ignore[attr-defined]
    try:
        yield extension
    finally:
        module._C = previous  # type: ignore[attr-defined]
