"""CohortTrainer: local SGD of a whole cohort of clients at once, on the device.

Every local objective of docs/algorithms.md §2 is one step rule,

    w ← w - eta_l * (grad_scale * g_k(w) + decay ⊙ w + shift),

with per-client or shared ``grad_scale``, ``decay`` and ``shift`` (see :class:`StepRule`):
FedAvg has none of them, FedProx ``decay = mu, shift = -mu * w_start``, SCAFFOLD
``shift = c - c_k``, IGFL-C ``grad_scale = 1 + 1/|S|`` and a constant shift, EFL
``decay = lam * U, shift = -lam * V``. The trainer therefore knows nothing about algorithms
(EFL's Fisher reports are :mod:`lfed.client.fisher`'s).

Two backends with the same maths (docs/architecture.md; how close their results are: docs/reproducibility.md):

* ``vmap``: the K clients' parameters are one ``[K, P]`` tensor; each local step is one call of
  ``vmap(grad(loss))`` over the stacked parameters and a gathered ``[K, B, ...]`` batch.
* ``loop``: one client after another with ordinary autograd, for models that cannot be
  vmapped (cuDNN RNNs, custom kernels). BatchNorm trains on both: under ``vmap`` each client's
  running statistics are its own row (:mod:`lfed.engine.norm`).

Both consume the same batch schedule (:func:`batch_schedule`), so they agree to round-off.
Uneven client sizes and partial batches are masked; clients that completed fewer steps
(stragglers) stop updating after their last step and, in ``vmap``, drop out of the
computation of later steps.

The parts, one concept a module:

* :mod:`lfed.engine.rule`: the step rule (:class:`StepRule`, :class:`LossTerm`);
* :mod:`lfed.engine.batches`: batch schedules (:func:`batch_schedule`, :func:`steps_per_epoch`);
* :mod:`lfed.engine.losses`: per-example losses (:func:`as_per_example_loss`, :func:`per_example_mean`);
* :mod:`lfed.engine.result`: what training returns (:class:`CohortResult`);
* :mod:`lfed.engine.vmap`: the ``vmap`` backend;
* :mod:`lfed.engine.recorded`: the ``vmap`` backend's recorded step (record once per shape, replay);
* :mod:`lfed.engine.conv`: the ``vmap`` backend's convolutions as unfold + one batched matmul over
  the cohort (:func:`conv2d_matmul`, :func:`conv1d_matmul`), and the choice of that form or torch's;
* :mod:`lfed.engine.precision`: mixed precision (autocast) in the local steps only, float32 for the
  rest of a round (:func:`round_precision`, :func:`local_autocast`);
* :mod:`lfed.engine.patching`: a module instance's method replaced for a ``with`` block (the two forms above and below);
* :mod:`lfed.engine.norm`: BatchNorm inside the vmapped cohort (each client's running statistics its own row,
  batch statistics over the valid examples; :func:`has_running_stats`);
* :mod:`lfed.engine.loop`: the ``loop`` backend (one client after another; the reference of the vmap backend);
* :mod:`lfed.engine.trainer`: :class:`CohortTrainer`, chunking and the choice of backend.

Every name is importable from ``lfed.engine``; patch a name where it is used (its module above).
"""

from lfed.engine.batches import batch_schedule, steps_per_epoch
from lfed.engine.conv import conv1d_matmul, conv2d_matmul
from lfed.engine.losses import LossFn, as_per_example_loss, per_example_cross_entropy, per_example_mean
from lfed.engine.norm import has_running_stats
from lfed.engine.precision import local_autocast, round_precision
from lfed.engine.result import CohortResult
from lfed.engine.rule import LossTerm, StepRule
from lfed.engine.rule import _apply_step_ as _apply_step_  # private, imported from here by tests/engine/test_trainer.py
from lfed.engine.trainer import BACKENDS, CohortTrainer

__all__ = [
    "BACKENDS",
    "CohortResult",
    "CohortTrainer",
    "LossFn",
    "LossTerm",
    "StepRule",
    "as_per_example_loss",
    "batch_schedule",
    "conv1d_matmul",
    "conv2d_matmul",
    "has_running_stats",
    "local_autocast",
    "per_example_cross_entropy",
    "per_example_mean",
    "round_precision",
    "steps_per_epoch",
]
