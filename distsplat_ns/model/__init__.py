"""nerfstudio's model and its band loss: ``DistSplatModel`` (splatfacto's place), the band render,
backward, depth and loss terms, camera adjustment and eval outputs. Not here: the Gaussians' rows
and how they grow (``gaussians/``), the kernels (``rendering/``)."""
