"""The base of methods that keep part of the model on each client (FedPer, FedRep, FedBN; docs/algorithms.md §13).

A :class:`LocalPartRule` names its local parameters (:attr:`local`: ``fnmatch`` globs over parameter
names; default: the last layer, the head). The round (:mod:`lfed.core.round`, :class:`lfed.personal.sharing.Sharing`)
then:

* starts each cohort client's local training from ``[w_shared, u_k]``: the global shared part and
  the client's own local part ``u_k`` (:meth:`start_weights`);
* uploads, compresses, counts bits for, combines and server-steps the shared coordinates only;
  the global model's local coordinates stay at the initial model's;
* keeps ``u_k`` as this rule's per-client state (``local``, ``P_l`` numbers a row, in any
  ``client_state`` placement), written for the clients that trained (:meth:`after_local`).

``u_k`` is the global model's local part (the initial model's) until the client first trains, and
client ``k``'s personalized model is ``[w_shared, u_k]`` (:meth:`personal_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from lfed.base.declaration import Declaration, Supports
from lfed.client.objectives import ClientRule
from lfed.personal.sharing import Sharing
from lfed.state.spec import GLOBAL, StateSpec


def head_names(layout) -> list[str]:
    """The parameters of the module that owns the last trainable parameter (the classifier head)."""
    last = layout.names[-1]
    owner = last.rpartition(".")[0]
    return [n for n in layout.names if n.rpartition(".")[0] == owner]


class LocalPartRule(ClientRule):
    """Partial sharing: the parameters matching ``local`` stay on each client (module docstring).

    Args:
        local: Parameter-name globs of the local part (``"fc2.*"``, ``["head.weight", "head.bias"]``);
            None: the last layer (the module owning the last trainable parameter).
    """

    name = "local_part"
    declares = Declaration(supports=Supports(personalized=True))

    def __init__(self, local: str | Sequence[str] | None = None) -> None:
        super().__init__()
        if isinstance(local, str):
            local = [local]
        if local is not None:
            local = list(local)
            if not local or not all(isinstance(p, str) and p for p in local):
                raise ValueError(f"local: give parameter-name patterns (non-empty strings), or None for the last layer; "
                                 f"got {local!r}")
        self.local_patterns = local
        self.sharing: Sharing | None = None

    def hparams(self) -> dict:
        return {}

    def structure(self) -> dict:
        return {"local": "last layer" if self.local_patterns is None else ",".join(self.local_patterns)}

    def local_names(self, net, layout) -> list[str]:
        """Names of the local parameters of ``net`` (the patterns resolved)."""
        if self.local_patterns is None:
            return head_names(layout)
        return list(Sharing.from_patterns(layout, self.local_patterns, "local").local_names)

    def make_sharing(self, net, layout) -> Sharing:
        if self.local_patterns is not None:
            return Sharing.from_patterns(layout, self.local_patterns, "local")
        return Sharing(layout, self.local_names(net, layout))

    def _sharing(self) -> Sharing:
        if self.sharing is None:
            raise RuntimeError(f"{type(self).__name__}: the round has not resolved its local parameters yet "
                               "(Algorithm.attach(net, layout) before the state is allocated)")
        return self.sharing

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("local", init=GLOBAL)]  # "P" is P_l here: the store gives the objective its local size

    def local_rows(self, clients: Tensor, w: Tensor) -> Tensor:
        """``[K, P_l]`` the local parts ``u_k`` of ``clients`` (the global model's local part before a client's first training)."""
        return self.rows("local", clients, first=self._sharing().local(w))

    def start_weights(self, cohort, w: Tensor) -> Tensor:
        return self._sharing().merge(w, self.local_rows(cohort.clients, w))

    def after_local(self, cohort, w_start, w_end, lr, local) -> Tensor | None:
        self.write_rows("local", cohort.clients, self._sharing().local(w_end), mask=cohort.active)
        return None

    def personal_rows(self, clients: Tensor, w: Tensor, local) -> Tensor:
        return self._sharing().merge(w, self.local_rows(clients, w))
