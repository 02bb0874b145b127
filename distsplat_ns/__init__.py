"""distsplat_ns: data-parallel Gaussian splatting for nerfstudio (method ``distsplat``).

Importing the package is light: no nerfstudio, gsplat or CUDA work happens here.
"""

__version__ = "0.1.0"
