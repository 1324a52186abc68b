"""The round core, with no Lightning in it: one round (:mod:`~lfed.core.round`), one run and its one loop
(:mod:`~lfed.core.run`: :func:`~lfed.core.run.train_step`), the two schedules (:mod:`~lfed.core.synchronous`,
:mod:`~lfed.core.asynchronous`), several runs' cohorts in one engine call (:mod:`~lfed.core.lockstep`), the settings
(:mod:`~lfed.core.settings`), the registry of names (:mod:`~lfed.core.registry`) and :func:`~lfed.core.fit.fit_run`.
docs/architecture.md draws the tree."""
