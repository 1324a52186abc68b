"""The component contract: what every piece of a round is and sees (:mod:`lfed.base.component`)."""
