"""Small helpers every floor may use: logging, errors, validation, dtypes, timing, shared memory,
signals and units. Imports nothing else of the package; no nerfstudio."""
