"""Start-up cost of every ``ns-*`` command: teach ``inspect`` which module a frozen frame is.

nerfstudio 1.1.5 builds its list of installable external methods at import
(``nerfstudio/configs/external_methods.py:get_external_methods``), and each of its 26 entries calls
``inspect.stack()``. For every frame of the import machinery (file name ``<frozen
importlib._bootstrap>``, a file that does not exist) ``inspect.getmodule`` finds no cached answer
and scans every module in ``sys.modules`` -- about 4,400 once torch 2.14 and torchvision are
imported -- so the list costs seconds of CPU (2.6 s of them avoidable, docs/startup.md) in every process that lists methods: each
``ns-train`` rank, ``ns-export``, ``ns-eval``. Measured in docs/startup.md.

nerfstudio discovers plugins (importing ``distsplat_ns.registry``) just before it builds that
list, so the registry records the frozen modules' names in ``inspect``'s file-to-module cache
first. ``getmodule`` then answers those frames from the cache with the module the scan would have
found, if it could, and ``inspect.stack()`` returns what it returned before.
"""

from __future__ import annotations

import inspect
import sys


def register_frozen_module_files() -> int:
    """Map ``<frozen NAME>`` to each frozen module already imported in ``inspect.modulesbyfile``.

    Returns how many entries were added (0 when called again). Entries already present are kept.
    """
    added = 0
    for key, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if getattr(spec, "origin", None) != "frozen":
            continue
        filename = f"<frozen {module.__name__}>"
        if filename not in inspect.modulesbyfile:
            # by its own name where sys.modules has it under that name (importlib._bootstrap is also _frozen_importlib)
            inspect.modulesbyfile[filename] = module.__name__ if sys.modules.get(module.__name__) is module else key
            added += 1
    return added
