"""The training images: parsing, the encoded store shared by the ranks of a host, decode workers,
the per-step batch and its upload. Not here: what a rank renders from them (``pipeline/``,
``model/``); the cameras' band plans (``balance/``)."""
