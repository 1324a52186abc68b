"""FedRoD (Chen & Chao 2022, "On Bridging Generic and Personalized Federated Learning for Image Classification",
ICLR; the linear personal head; docs/algorithms.md §13).

The net is a body ``z = f(x; θ)`` and a linear head, the *generic* head ``G(z) = W z + b`` (``ψ = (W, b)``),
both shared and averaged by the server as FedAvg. Each client ``k`` also keeps a *personal* head
``P_k(z) = U_k z + c_k`` (``φ_k``, the same shape as ``ψ``) that never leaves it. At every local step on a batch,
from the step's values (one simultaneous step, as one optimizer over both losses does):

    θ, ψ ← θ, ψ − η ∇_{θ,ψ} L_BSM(θ, ψ),   L_BSM = −log( n_{k,y} e^{G(z)_y} / Σ_c n_{k,c} e^{G(z)_c} )
    φ_k  ← φ_k − η ∇_φ CE( sg[G(z)] + P_k(sg[z]), y )

``n_{k,c}`` is client ``k``'s count of class ``c`` among its training examples: the balanced softmax (Ren
et al. 2020, the class-prior correction FedRoD trains its generic head with) is cross-entropy on ``G(z) + log n_k``, a class
the client does not have dropping out of the normalizer (``log 0 = −∞``). ``sg`` stops the gradient: the
personal head trains on the body's detached features on top of the detached generic logits (the
"personalized predictor learned on top of the generic one"). The personalized prediction is
``G(z) + P_k(z) = (W + U_k) z + (b + c_k)``: client ``k``'s personalized model is the global model with its
head replaced by ``ψ + φ_k``, one row of the same net (the paper's linear personal head; its hypernetwork
variant is not implemented). ``φ_k`` starts at 0 (a client that never trained is served by the generic model).

In lfed's shape: the generic loss is the run's cross-entropy plus a :class:`~lfed.engine.LossTerm`
``CE(G(z) + log n_k, y) − CE(G(z), y)`` (so the run's loss must be the default cross-entropy), and the
personal head's gradient is the head gradient of the merged row ``[θ, ψ + φ_k]`` under plain cross-entropy
(``∂/∂U_k CE((W + U_k) z + ...) = ∂/∂W'`` of ``CE(W' z + ...)`` at ``W' = W + U_k``). Because ``φ_k`` needs
``θ_t, ψ_t`` at every step, the cohort is replayed step by step on the round's own batches (as APFL): each
step is one engine call over ``2K`` rows ``[w_t; merged_t]``, the first ``K`` at ``η`` with the balanced-softmax
term, the others at learning rate 1 with the gradient masked to the head (a gradient read back as
``row − (row − ∇)``). The round's own training is discarded: a round costs about three FedAvg rounds of local
work and ``T`` engine calls. A straggler stops after its ``s_k`` steps; an inactive client keeps ``φ_k``.

    model:
      algorithm: fedrod                    # or objective: {class_path: lfed.personal.fedrod.FedRoD, init_args: {head: fc2}}
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lfed.base.declaration import Declaration, Supports
from lfed.client.objectives import ClientRule
from lfed.engine import LossTerm, StepRule, batch_schedule
from lfed.engine.losses import per_example_cross_entropy
from lfed.rng import round_generator
from lfed.state.spec import StateSpec


def balanced_softmax_term(params, out: Tensor, x: Tensor, y: Tensor, log_prior: Tensor) -> Tensor:
    """``[B]``: ``CE(out + log_prior, y) − CE(out, y)`` per example, classes with ``log_prior = −∞`` out of the normalizer.

    Added to the run's cross-entropy it makes the balanced softmax loss ``CE(out + log n_k, y)``; with
    ``log_prior = 0`` it is 0 (plain cross-entropy: FedRoD's personal rows).
    """
    finite = torch.where(torch.isfinite(log_prior), log_prior, torch.zeros_like(log_prior))
    adjusted = out + log_prior
    target = (out + finite).gather(-1, y[:, None]).squeeze(-1)  # finite for a padding example of an absent class
    balanced = torch.logsumexp(adjusted, dim=-1) - target
    plain = torch.logsumexp(out, dim=-1) - out.gather(-1, y[:, None]).squeeze(-1)
    return balanced - plain


class FedRoD(ClientRule):
    """FedRoD (module docstring).

    Args:
        head: The name of the net's generic head, an ``nn.Linear`` submodule (``"fc2"``, ``"net.2"``); None: the
            module that owns the net's last trainable parameter.
    """

    name = "fedrod"
    declares = Declaration(supports=Supports(personalized=True))

    def __init__(self, head: str | None = None) -> None:
        super().__init__()
        if head is not None and (not isinstance(head, str) or not head):
            raise ValueError(f"head: give the name of the net's generic head (an nn.Linear submodule), or None for the "
                             f"last layer; got {head!r}")
        self.head = head
        self._index: Tensor | None = None  # positions of the head's parameters in the flat vector
        self.num_classes: int | None = None

    def hparams(self) -> dict:
        return {}

    def structure(self) -> dict:
        return {"head": "last layer" if self.head is None else self.head}

    def make_sharing(self, net: nn.Module, layout) -> None:
        """Resolve the head (every parameter stays shared: FedRoD's personal head is extra state, not a local part)."""
        if self.head is None:
            owner = layout.names[-1].rpartition(".")[0]
        else:
            owner = self.head
        try:
            module = net.get_submodule(owner)
        except AttributeError:
            names = [n for n, m in net.named_modules() if isinstance(m, nn.Linear)]
            raise ValueError(f"head: {owner!r} is not a submodule of the net; its nn.Linear submodules: {names}") from None
        if not isinstance(module, nn.Linear):
            raise ValueError(f"head: FedRoD's heads are linear (the personalized logits G(z) + P(z) are one linear "
                             f"head); {owner or 'the net'!r} is a {type(module).__name__}. Name an nn.Linear "
                             "submodule, the net's classifier")
        prefix = f"{owner}." if owner else ""
        names = [prefix + n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not names or any(n not in layout.names for n in names):
            raise ValueError(f"head: {owner!r} has no trainable parameters of the net ({list(layout.names)})")
        offsets = torch.tensor([0, *layout.sizes]).cumsum(0).tolist()
        parts = [torch.arange(offsets[i], offsets[i + 1]) for i, n in enumerate(layout.names) if n in names]
        self._index = torch.cat(parts)
        self.num_classes = module.out_features
        return None

    def _head(self) -> Tensor:
        if self._index is None:
            raise RuntimeError("FedRoD: the round has not resolved its head yet (Algorithm.attach before the state)")
        return self._index

    def state_specs(self) -> list[StateSpec]:
        return [StateSpec("personal_head", shape=(int(self._head().numel()),), rows=True)]  # φ_k, 0 at first

    def _merged(self, w: Tensor, phi: Tensor) -> Tensor:
        """``[K, P]``: ``w`` (``[P]`` or ``[K, P]``) with the head ``ψ + φ_k`` (the personalized model)."""
        index = self._head().to(w.device)
        out = w.expand(phi.shape[0], -1).clone()
        out[:, index] += phi.to(out.dtype)
        return out

    def _check_loss(self, engine) -> None:
        fn = getattr(engine, "loss_fn", None)
        plain_ce = isinstance(fn, nn.CrossEntropyLoss) and fn.weight is None and fn.label_smoothing == 0.0
        if fn is not per_example_cross_entropy and not plain_ce:
            raise ValueError(f"loss: FedRoD's losses are the balanced softmax and cross-entropy on the logits; the run's "
                             f"loss is {fn!r}. Leave loss unset (cross-entropy)")

    def label_counts(self, local) -> Tensor:
        """``[K, C]`` each cohort client's count of every class among its training examples."""
        K, width = local.index.shape
        y = local.data_y[local.index.reshape(-1)].reshape(K, width)
        real = torch.arange(width, device=y.device)[None, :] < local.num_examples.to(y.device)[:, None]
        C = self.num_classes  # every training label is in [0, C): checked once before round 0 (check)
        return torch.zeros(K, C, dtype=torch.float64, device=y.device).scatter_add_(
            1, y.clamp(0, C - 1).long(), real.to(torch.float64))

    def check(self, context) -> list[str]:
        """Every training label is one of the head's classes (read once, before round 0, not in every round)."""
        C, data = self.num_classes, context.data
        if data is not None and C is not None and data.train_y.numel() and bool(((data.train_y < 0) | (data.train_y >= C)).any()):
            raise ValueError(f"head: FedRoD's head has {C} outputs but the training labels reach "
                             f"{int(data.train_y.max())}; give the net one output per class")
        return super().check(context)

    def after_local(self, cohort, w_start, w_end, lr, local) -> Tensor:
        self._check_loss(local.engine)
        K = cohort.clients.numel()
        steps = (local.steps_done if local.host_steps_done is None else local.host_steps_done).detach().cpu().long()
        T = int(steps.max()) if K else 0  # host values (lfed.engine.host): no device read inside the round
        n_host = local.num_examples if local.host_num_examples is None else local.host_num_examples
        positions, valid = batch_schedule(n_host, T, local.batch_size,
                                          round_generator(local.seed, local.round, "batches"))  # the round's own batches
        w = w_start.expand(K, -1).clone()
        phi = self.rows("personal_head", cohort.clients).to(w.dtype)
        log_prior = self.label_counts(local).log().to(w.dtype)  # log n_{k,c}; −∞ for an absent class
        index = self._head().to(w.device)
        mask = torch.ones(2 * K, w.shape[1], dtype=w.dtype, device=w.device)
        mask[K:] = 0
        mask[K:, index] = 1  # the personal rows: the head's gradient only
        term = LossTerm(balanced_softmax_term, torch.cat([log_prior, torch.zeros_like(log_prior)]).to(w.device))
        rule = StepRule(loss_term=term, grad_mask=mask)
        rates = torch.cat([torch.full((K,), float(lr), dtype=torch.float64), torch.ones(K, dtype=torch.float64)])
        both = local.tiled(2)
        for t in range(T):
            moving = (steps > t).to(w.device)
            merged = self._merged(w, phi)  # [θ_t, ψ_t + φ_t]
            pos, ok = positions[:, t : t + 1], valid[:, t : t + 1]
            out = both.train(torch.cat([w, merged]), rule, steps=torch.cat([moving, moving]).long(), lr=rates,
                             schedule=(torch.cat([pos, pos]), torch.cat([ok, ok]))).weights
            g_phi = (merged - out[K:]).index_select(1, index)  # ∇_φ CE(G(z) + P(z)) on detached z and G(z)
            phi = torch.where(moving[:, None], phi - lr * g_phi, phi)
            w = out[:K]  # θ, ψ after one balanced-softmax step
        self.write_rows("personal_head", cohort.clients, phi, mask=cohort.active)
        return w

    def personal_rows(self, clients: Tensor, w: Tensor, local) -> Tensor:
        return self._merged(w, self.rows("personal_head", clients).to(w.dtype))
