"""The Lightning front door: everything of lfed that imports Lightning (the module and its driver, lock-step groups,
the data module, ``lfed fit`` and ``lfed grid``, sweeps, callbacks, checkpoints, logs, DDP). The round core
(:mod:`lfed.core`) imports nothing from here."""

from lfed.lightning.reporting import silence_library_noise

# narrow filters for library messages that are not the user's problem, installed once Lightning is used (any module
# of this package imports it)
silence_library_noise()
