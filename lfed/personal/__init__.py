"""Personalized federated learning (docs/algorithms.md §13, docs/personalization.md): one client rule per method.

* :class:`~lfed.personal.finetune.FedAvgFT`: FedAvg, each client's model the global one fine-tuned on its data.
* :class:`~lfed.personal.ditto.Ditto`: a personal model per client trained towards the global one.
* :class:`~lfed.personal.fedper.FedPer`, :class:`~lfed.personal.fedrep.FedRep`,
  :class:`~lfed.personal.fedbn.FedBN`: partial sharing (:mod:`lfed.personal.sharing`), a local part per client.
* :class:`~lfed.personal.apfl.APFL`: a learned per-client mixture of a personal and the global model.
* :class:`~lfed.personal.perfedavg.PerFedAvg`: a meta-learned global model, personalized by steps of size α (FO / HF).
* :class:`~lfed.personal.fedrod.FedRoD`: a generic head on the balanced softmax and a personal head per client on top.

Every evaluation scores each client's personalized model (:meth:`~lfed.client.objectives.ClientRule.personal_rows`)
and the global model on the client's own held-out split (``personal/acc_*``, ``global/acc_*``:
:meth:`lfed.core.run.FederatedRun.personal_evaluation`).

Every method is importable from ``lfed.personal`` (imported on first use), with the pieces of a method with a
local part: :class:`~lfed.personal.local_part.LocalPartRule` (FedPer in full; FedRep and FedBN subclass it) and
:class:`~lfed.personal.sharing.Sharing` (what :meth:`~lfed.client.ClientRule.make_sharing` returns).
"""

from lfed import _lazy_exports

_LAZY = {
    "FedAvgFT": "lfed.personal.finetune",
    "Ditto": "lfed.personal.ditto",
    "FedPer": "lfed.personal.fedper",
    "FedRep": "lfed.personal.fedrep",
    "FedBN": "lfed.personal.fedbn",
    "APFL": "lfed.personal.apfl",
    "PerFedAvg": "lfed.personal.perfedavg",
    "FedRoD": "lfed.personal.fedrod",
    "LocalPartRule": "lfed.personal.local_part",
    "Sharing": "lfed.personal.sharing",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
