"""``python -m lfed ...``: the ``lfed`` command (:func:`lfed.entry.main`)."""

from lfed.entry import main

main()
