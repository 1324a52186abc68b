"""The Lightning front door: everything of lfed that imports Lightning (the module and its driver, lock-step groups,
the data module, ``lfed fit`` and ``lfed grid``, sweeps, callbacks, checkpoints, logs, DDP). The round core
(:mod:`lfed.core`) imports nothing from here."""
