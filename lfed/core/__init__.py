"""The round core, with no Lightning in it: one round as a function (:mod:`~lfed.core.round`; the components and
training plan it takes, :mod:`~lfed.core.algorithm`; what it did, :mod:`~lfed.core.record`), one training step told
top-down (:mod:`~lfed.core.step`: :func:`~lfed.core.step.train_step`), one run (:mod:`~lfed.core.run`), the two
schedules (:mod:`~lfed.core.synchronous`, :mod:`~lfed.core.asynchronous`), several runs' cohorts in one engine call
(:mod:`~lfed.core.lockstep`), the settings (:mod:`~lfed.core.settings`), the registry of names
(:mod:`~lfed.core.registry`) and :func:`~lfed.core.fit.fit_run`. docs/architecture.md draws the tree."""
