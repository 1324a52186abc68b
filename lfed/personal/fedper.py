"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary 2019, "Federated Learning with Personalization Layers";
docs/algorithms.md §13).

The model is a shared base and a local head (the personalization layers). Each round the cohort's
clients train base and head together from the global base and their own head
(``[w_base, u_k]``), as FedAvg's local SGD; the server aggregates the base only; each client keeps
its head (initialised from the initial model). Personalized model of client ``k``: ``[w_base, u_k]``.
Everything but the naming of the head is :class:`lfed.personal.local_part.LocalPartRule`.

    model:
      algorithm: fedper
      objective: {class_path: lfed.personal.fedper.FedPer, init_args: {local: ["fc2.*"]}}   # default: the last layer
"""

from __future__ import annotations

from lfed.personal.local_part import LocalPartRule


class FedPer(LocalPartRule):
    """FedPer (module docstring). ``local``: the head's parameter-name globs (None: the last layer)."""

    name = "fedper"
