"""The process group and what survives faults: the context, collectives, restart and outcome
agreement, the distributed checkpoint's rows. The only code that imports ``torch.distributed``. Not
here: what differs between the replicated and sharded modes (``parallel/``)."""
