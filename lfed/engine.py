"""CohortTrainer: local SGD of a whole cohort of clients at once, on the device.

Every local objective of SPEC §2 is one step rule,

    w ← w - eta_l * (grad_scale * g_k(w) + decay ⊙ w + shift),

with per-client or shared ``grad_scale``, ``decay`` and ``shift`` (see :class:`StepRule`):
FedAvg has none of them, FedProx ``decay = mu, shift = -mu * w_start``, SCAFFOLD
``shift = c - c_k``, IGFL-C ``grad_scale = 1 + 1/|S|`` and a constant shift, EFL
``decay = lam * U, shift = -lam * V``. The trainer therefore knows nothing about algorithms
(EFL's Fisher reports are :mod:`lfed.client.fisher`'s).

Two backends with the same maths (DESIGN.md):

* ``vmap``: the K clients' parameters are one ``[K, P]`` tensor; each local step is one call of
  ``vmap(grad(loss))`` over the stacked parameters and a gathered ``[K, B, ...]`` batch.
* ``loop``: one client after another with ordinary autograd, for models that cannot be
  vmapped (BatchNorm with running statistics, cuDNN RNNs).

Both consume the same batch schedule (:func:`batch_schedule`), so they agree to round-off.
Uneven client sizes and partial batches are masked; clients that completed fewer steps
(stragglers) stop updating after their last step and, in ``vmap``, drop out of the
computation of later steps.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from lfed.params import ParamLayout

BACKENDS = ("auto", "vmap", "loop")

LossFn = Callable[[Tensor, Tensor], Tensor]


def per_example_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy per example (``reduction='none'``): lfed's default client loss."""
    return F.cross_entropy(logits, target, reduction="none")


def as_per_example_loss(loss: nn.Module | LossFn | None) -> LossFn:
    """Turn a user's loss into one that returns a loss per example.

    A ``torch.nn`` loss module with a ``reduction`` attribute is copied with
    ``reduction='none'``. A plain callable may return one value per example (``[B]`` or
    ``[B, ...]``) or one value for the whole batch (``F.cross_entropy`` with its default mean, a
    lambda with ``.sum()``): then it is evaluated example by example (``torch.func.vmap`` over the
    batch), so the engine's mask keeps the padding of a partial last batch out of the mean.
    """
    if loss is None:
        return per_example_cross_entropy
    if isinstance(loss, nn.Module) and hasattr(loss, "reduction"):
        import copy

        loss = copy.copy(loss)
        loss.reduction = "none"
        return loss
    if not callable(loss):
        raise ValueError(f"loss: expected a torch.nn loss or a callable (logits, target) -> per-example loss, got {loss!r}")
    return _PerExample(loss)


class _PerExample:
    """A plain loss callable made per-example (see :func:`as_per_example_loss`)."""

    def __init__(self, loss: LossFn) -> None:
        self.loss = loss
        self._one = lambda o, t: loss(o[None], t[None]).reshape(())

    def __call__(self, out: Tensor, target: Tensor) -> Tensor:
        value = self.loss(out, target)
        if value.dim() >= 1 and value.shape[0] == out.shape[0]:
            return value
        if value.numel() != 1:
            raise ValueError(
                f"loss: returned shape {tuple(value.shape)} for a batch of {out.shape[0]}; expected one value "
                f"per example ([{out.shape[0]}]) or one value for the batch"
            )
        try:  # one call over the batch where the loss can be vmapped
            return torch.func.vmap(self._one)(out, target)
        except Exception:  # noqa: BLE001 - a loss vmap cannot run: example by example
            return torch.stack([self._one(out[i], target[i]) for i in range(out.shape[0])])

    def __repr__(self) -> str:
        return f"per_example({self.loss!r})"


def per_example_mean(per_example: Tensor) -> Tensor:
    """``[B]`` from a per-example loss ``[B]`` or ``[B, ...]`` (e.g. squared errors: one mean per example)."""
    return per_example.reshape(per_example.shape[0], -1).mean(1) if per_example.dim() > 1 else per_example


def has_running_stats(net: nn.Module) -> bool:
    """Whether ``net`` holds BatchNorm running statistics (which vmap cannot update)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in net.modules())


@dataclass
class LossTerm:
    """A term added to each example's loss, for objectives that change the loss, not the step (MOON, Ditto).

    ``fn(params, out, x, y, aux)`` gets one client's parameters (``{name: tensor}`` in the
    layout's order), the net's outputs ``out`` ``[B, ...]`` on the batch ``x``, ``y`` and the
    client's own row of ``aux``, and returns the term per example (``[B]``) or one value for the
    batch (added to every example). The engine adds it to the per-example loss before the masked
    mean, under ``vmap`` (the vmap backend) or per client (the loop backend), so ``g`` in the
    step rule is the gradient of the changed loss.

    Attributes:
        fn: The term, written for one client (no cohort dimension).
        aux: A tensor or a dict of tensors, each ``[K, ...]``: per-client inputs of ``fn`` (e.g.
            the start weights, or another model's parameters); None if ``fn`` needs none.
    """

    fn: Callable[..., Tensor]
    aux: Tensor | dict[str, Tensor] | None = None

    def select(self, rows: Tensor | int | slice, num_clients: int) -> LossTerm:
        """The term of a subset of the K clients: the rows of ``aux``."""
        return replace(self, aux=_pick_rows(self.aux, rows, num_clients))

    def client(self, k: int) -> Tensor | dict[str, Tensor] | None:
        """Client ``k``'s row of ``aux``."""
        return _pick_rows(self.aux, k, None)


def _pick_rows(aux, rows, num_clients: int | None):
    if aux is None:
        return None
    if isinstance(aux, dict):
        return {name: _pick_rows(a, rows, num_clients) for name, a in aux.items()}
    if num_clients is not None and aux.shape[0] != num_clients:
        raise ValueError(f"loss term: aux has {aux.shape[0]} rows for a cohort of {num_clients} clients")
    return aux[rows]


@dataclass
class StepRule:
    """The local step ``w ← w - lr * (grad_scale * g + decay ⊙ w + shift)`` for K clients.

    Attributes:
        grad_scale: A float, or ``[K]`` per client.
        decay: None, a float, ``[P]`` shared, or ``[K, P]`` per client.
        shift: None, ``[P]`` shared, or ``[K, P]`` per client.
        loss_term: None, or a :class:`LossTerm` added to each example's loss (``g`` is then the
            gradient of the changed loss).
    """

    grad_scale: float | Tensor = 1.0
    decay: float | Tensor | None = None
    shift: Tensor | None = None
    loss_term: LossTerm | None = None

    def direction(self, g: Tensor, w: Tensor) -> Tensor:
        """The step direction for gradients ``g`` and weights ``w`` (both ``[K, P]`` or ``[P]``)."""
        return self.direction_(g.clone(), w)

    def direction_(self, g: Tensor, w: Tensor) -> Tensor:
        """:meth:`direction` in place: ``g`` (a fresh gradient) becomes the direction and is returned.

        The one implementation of the rule: training (:func:`_apply_step_`) and :meth:`direction` both run it.
        """
        scale = self.grad_scale
        if isinstance(scale, Tensor):
            g.mul_(scale[:, None] if scale.dim() == 1 and g.dim() == 2 else scale)
        elif scale != 1.0:
            g.mul_(scale)
        if self.decay is not None:
            if isinstance(self.decay, Tensor):
                g.addcmul_(self.decay, w)
            else:
                g.add_(w, alpha=self.decay)
        if self.shift is not None:
            g.add_(self.shift)
        return g

    def select(self, rows: Tensor | int, num_clients: int) -> StepRule:
        """The rule of a subset of the K clients (``rows`` indexes the cohort)."""

        def pick(x, per_client_dim):
            if isinstance(x, Tensor) and x.dim() == per_client_dim and x.shape[0] == num_clients:
                return x[rows]
            return x

        term = None if self.loss_term is None else self.loss_term.select(rows, num_clients)
        return replace(self, grad_scale=pick(self.grad_scale, 1), decay=pick(self.decay, 2), shift=pick(self.shift, 2),
                       loss_term=term)


@dataclass
class CohortResult:
    """What local training of a cohort returns.

    Attributes:
        weights: ``[K, P]`` final client weights ``w_k_end``.
        loss: ``[K]`` mean training loss over the steps each client took (0 for none).
        buffers: ``{name: [K, ...]}`` final client buffers (``loop`` backend with running
            statistics only), else None.
    """

    weights: Tensor
    loss: Tensor
    buffers: dict[str, Tensor] | None = None


def steps_per_epoch(num_examples: Tensor, batch_size: int | None) -> Tensor:
    """``ceil(n_k / B)`` per client (1 for full-batch, ``batch_size=None``)."""
    if batch_size is None:
        return torch.ones_like(num_examples)
    return torch.div(num_examples + batch_size - 1, batch_size, rounding_mode="floor").clamp_min(1)


def batch_schedule(
    num_examples: Tensor, num_steps: int, batch_size: int | None, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Mini-batch positions of every client for every local step of a round.

    Client k reshuffles its ``n_k`` examples at the start of each local epoch and walks
    through them in batches of ``B`` (the last one partial). Step ``t`` is batch
    ``t mod ceil(n_k/B)`` of epoch ``t // ceil(n_k/B)``.

    Args:
        num_examples: ``[K]`` client sizes ``n_k``.
        num_steps: Number of steps to schedule (the largest step count of the cohort).
        batch_size: ``B``, or None for full-batch steps.
        generator: CPU generator; the schedule depends on it alone, so both backends and
            any device see the same batches.

    Returns:
        ``positions [K, T, B']`` (indices into each client's own example list) and
        ``valid [K, T, B']`` (False on padding), with ``B' = min(B, max n_k)``.
    """
    n = num_examples.detach().cpu().long()
    K, max_n = n.numel(), int(n.max())
    B = max_n if batch_size is None else min(int(batch_size), max_n)
    nb = steps_per_epoch(n, batch_size)
    T = max(int(num_steps), 0)
    if T == 0:
        empty = torch.zeros(K, 0, B, dtype=torch.long)
        return empty, empty.bool()
    epochs = int(torch.div(T + nb - 1, nb, rounding_mode="floor").max())
    keys = torch.rand(K, epochs, max_n, generator=generator, dtype=torch.float64)
    keys.masked_fill_((torch.arange(max_n) >= n[:, None])[:, None, :], math.inf)
    perm = keys.argsort(dim=-1)
    t = torch.arange(T)
    epoch = torch.div(t[None, :], nb[:, None], rounding_mode="floor")  # [K, T]
    batch = t[None, :] % nb[:, None]
    pos = batch[..., None] * (B if batch_size is not None else max_n) + torch.arange(B)  # [K, T, B]
    valid = pos < n[:, None, None]
    positions = perm[torch.arange(K)[:, None, None], epoch[..., None], pos.clamp(max=max_n - 1)]
    return positions, valid


def _has_hooks(net: nn.Module) -> bool:
    """Whether any module hook (global, or of ``net`` or a submodule) would run in a forward/backward."""
    from torch.nn.modules import module as m

    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks"):
        if getattr(m, name, None):
            return True
    return any(
        mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or getattr(mod, "_backward_pre_hooks", None)
        for mod in net.modules()
    )


def _leaves(out) -> list[Tensor]:
    g, loss = out
    return [*g.values(), loss]


def _rng_state(device: torch.device):
    cpu = torch.get_rng_state()
    return cpu, (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


#: The loop backend gathers this many steps' mini-batches at once (fewer small indexing operations per step).
_LOOP_GATHER_STEPS = 32


def _is_plain(rule: StepRule) -> bool:
    """Whether the rule is plain SGD (``w ← w - lr g``): no scale, decay or shift."""
    return rule.decay is None and rule.shift is None and not isinstance(rule.grad_scale, Tensor) and rule.grad_scale == 1.0


def _uniform_lr(lr: float | Tensor) -> float | Tensor:
    """A per-row learning rate whose rows all agree, as the float itself (the single-run path)."""
    if isinstance(lr, Tensor) and lr.numel() > 0 and bool((lr == lr[0]).all()):
        return float(lr[0])
    return lr


def _lr_runs(lr: Tensor) -> list[tuple[int, int, float]]:
    """``[(start, stop, value)]``: the runs of equal values of a per-row learning rate ``[K]``."""
    values = lr.tolist()
    runs, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((start, i, values[start]))
            start = i
    return runs


def _apply_step_(w: Tensor, g: Tensor, rule: StepRule, lr: float) -> None:
    """``w ← w - lr * (scale g + decay ⊙ w + shift)`` in place; ``g`` (a fresh gradient) is overwritten.

    ``w`` and ``g`` are ``[K, P]`` (or ``[P]`` for one client), the rule's tensors broadcast
    against them as in :meth:`StepRule.direction` (whose in-place form this runs).
    """
    w.add_(rule.direction_(g, w), alpha=-lr)


class CohortTrainer:
    """Runs the local training of a cohort of clients (SPEC §1, §2) on one device.

    Args:
        net: The model; only its structure and buffers are used, parameters come in flat.
        loss: Per-example loss (see :func:`as_per_example_loss`); cross-entropy by default.
        backend: ``"vmap"``, ``"loop"`` or ``"auto"`` (vmap unless the model cannot be vmapped).
        chunk_size: Train at most this many clients at once (bounds memory); None chooses:
            on a CPU the vmap backend trains chunks that keep ``[chunk, P]`` within 16 MB (see
            :meth:`_auto_chunk`), otherwise the whole cohort at once. Chunking never changes
            the result, only speed and memory.
        trace: Record the vmap backend's local step once per shape as a graph of ATen
            operations (``torch.fx`` ``make_fx``) and replay it, which skips the Python work of
            ``vmap``, ``grad`` and ``functional_call`` on every step. The replay runs the very
            operations the eager step runs (the first one is checked bit for bit against it);
            models with hooks, and steps on part of a cohort (stragglers), run eagerly.
    """

    def __init__(
        self,
        net: nn.Module,
        loss: nn.Module | LossFn | None = None,
        backend: Literal["auto", "vmap", "loop"] = "auto",
        chunk_size: int | None = None,
        trace: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {BACKENDS}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size: must be >= 1 or None, got {chunk_size}")
        if backend == "vmap" and has_running_stats(net):
            raise ValueError(
                "backend='vmap' cannot train a model with BatchNorm running statistics "
                f"({type(net).__name__}): each client would update shared buffers in place. "
                "Use backend='loop' (or 'auto'), or a norm without running stats (GroupNorm, "
                "BatchNorm(track_running_stats=False))."
            )
        self.net = net
        self.loss_fn = as_per_example_loss(loss)
        self.layout = ParamLayout.from_module(net)
        self.requested_backend = backend
        self.chunk_size = chunk_size
        self._backend: str | None = None if backend == "auto" else backend
        # one step of the vmap backend: ({name: [K, *shape]}, x, y, mask, buffers) -> per-parameter
        # gradients and losses (per parameter, so no flat [K, P] gradient is assembled on the way)
        self._vmapped = vmap(grad_and_value(self._client_loss), in_dims=(0, 0, 0, 0, None), randomness="different")
        # the same with a LossTerm (its function and its per-client aux rows as the last two arguments)
        self._vmapped_term = vmap(grad_and_value(self._client_loss_with_term), in_dims=(0, 0, 0, 0, None, None, 0),
                                  randomness="different")
        self._work: nn.Module | None = None  # the loop backend's private copy of ``net``
        self.trace = bool(trace)
        self._traced: dict[tuple, Callable] = {}  # recorded vmap steps by shapes, dtypes, device, mode

    # ----------------------------------------------------------------- backend choice
    @property
    def backend(self) -> str:
        """The backend in use (``auto`` is resolved on the first round)."""
        return self._backend or "undecided"

    def resolve_backend(self, x: Tensor, y: Tensor) -> str:
        """Pick the backend for ``auto``: vmap if a two-client probe step works, else loop."""
        if self._backend is not None:
            return self._backend
        if has_running_stats(self.net):
            self._backend = "loop"
            return self._backend
        try:
            w = self.layout.module_vector(self.net).to(x.device)
            W = torch.stack([w, w])
            xs, ys = x[:1].expand(2, 1, *x.shape[1:]), y[:1].expand(2, 1, *y.shape[1:])
            self._vmapped(
                self.layout.unflatten(W), xs, ys, torch.ones(2, 1, dtype=w.dtype, device=w.device), self._buffers()
            )
            self._backend = "vmap"
        except Exception:  # any vmap limitation (custom kernels, in-place buffer updates, cuDNN RNN)
            self._backend = "loop"
        return self._backend

    # ----------------------------------------------------------------- losses
    def _buffers(self) -> dict[str, Tensor]:
        return dict(self.net.named_buffers())

    def _client_loss(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor, buffers: dict[str, Tensor]
    ) -> Tensor:
        out = functional_call(self.net, (params, buffers), (x,))
        per_example = per_example_mean(self.loss_fn(out, y))
        return (per_example * mask).sum() / mask.sum().clamp_min(1)

    def _client_loss_with_term(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor, buffers: dict[str, Tensor],
        term: Callable[..., Tensor], aux: Any,
    ) -> Tensor:
        out = functional_call(self.net, (params, buffers), (x,))
        per_example = per_example_mean(self.loss_fn(out, y)) + term(params, out, x, y, aux)
        return (per_example * mask).sum() / mask.sum().clamp_min(1)

    # ----------------------------------------------------------------- training
    def train(
        self,
        w_start: Tensor,
        data_x: Tensor,
        data_y: Tensor,
        index: Tensor,
        num_examples: Tensor,
        steps_done: Tensor,
        rule: StepRule,
        lr: float | Tensor,
        batch_size: int | None,
        generator: torch.Generator | None,
        rows: Tensor | None = None,
        schedule: tuple[Tensor, Tensor] | None = None,
    ) -> CohortResult:
        """Local training of K clients from the broadcast weights ``w_start``.

        The rows need not belong to one run: :mod:`lfed.group` trains the cohorts of several
        runs in one call, each row with its own start weights (``w_start [K, P]``), learning
        rate (``lr [K]``) and batches (``schedule``), and their rules concatenated
        (:func:`lfed.group.concat_rules`). Each row's result is the one it gets trained alone.

        Args:
            w_start: ``[P]`` broadcast global weights, or ``[K, P]`` start weights per row.
            data_x, data_y: The pooled training tensors on the device.
            index: ``[K, max_n]`` positions of each client's examples in ``data_x``.
            num_examples: ``[K]`` client sizes ``n_k`` (only the first ``n_k`` of ``index`` count).
            steps_done: ``[K]`` local steps each client completes this round (``s_k``).
            rule: The objective's step rule (:class:`StepRule`).
            lr: Client learning rate ``eta_l``, or ``[K]`` one per row (float64 on the CPU; the step
                of each row uses its value exactly as the float ``lr`` would).
            batch_size: ``B``, or None for full-batch steps.
            generator: CPU generator for the batch schedule (unused when ``schedule`` is given).
            rows: Train only these rows of the cohort (``[K_r]`` indices; None: all K). The
                batch schedule is still drawn for all K, so each client trains exactly as it
                would beside the others (:mod:`lfed.distributed` splits a cohort over ranks so).
            schedule: ``(positions [K, T, B'], valid [K, T, B'])``, the batches of every row
                (:func:`batch_schedule`, ``T >= max(steps_done)``); None: drawn from ``generator``.

        Returns:
            The result of the trained rows, in the order of ``rows``.
        """
        K = index.shape[0]
        steps = steps_done.detach().cpu().long()
        if w_start.dim() == 2 and w_start.shape[0] != K:
            raise ValueError(f"w_start: {w_start.shape[0]} rows of start weights for a cohort of {K} clients")
        if isinstance(lr, Tensor):
            if lr.shape != (K,):
                raise ValueError(f"lr: a per-row learning rate must be [K] = [{K}], got shape {tuple(lr.shape)}")
            lr = lr.detach().cpu().double()
        if schedule is None:
            if generator is None:
                raise ValueError("generator: needed to draw the batch schedule (or give schedule=(positions, valid))")
            positions, valid = batch_schedule(num_examples, int(steps.max()) if K else 0, batch_size, generator)
        else:
            positions, valid = schedule
            if positions.shape[0] != K or positions.shape != valid.shape or (K and positions.shape[1] < int(steps.max())):
                raise ValueError(f"schedule: positions/valid must be [K={K}, T >= max steps, B'], got "
                                 f"{tuple(positions.shape)} and {tuple(valid.shape)}")
        positions, valid = positions.to(index.device), valid.to(index.device)
        backend = self.resolve_backend(data_x, data_y)
        run = self._train_vmap if backend == "vmap" else self._train_loop
        selected = torch.arange(K) if rows is None else rows.detach().cpu().long()
        if selected.numel() == 0:
            raise ValueError("rows: no rows to train; give at least one row of the cohort, or None for all")
        size = self.chunk_size or self._auto_chunk(selected.numel(), backend, w_start.device)
        results = []
        for lo in range(0, selected.numel(), size):
            part = selected[lo : lo + size]
            at = part.to(index.device)
            whole = rows is None and part.numel() == K
            sub_rule = rule if whole else rule.select(at, K)
            w0 = w_start if w_start.dim() == 1 or whole else w_start[part.to(w_start.device)]
            lr_part = _uniform_lr(lr if whole or not isinstance(lr, Tensor) else lr[part])
            results.append(run(w0, data_x, data_y, index[at], positions[at], valid[at], steps[part], sub_rule, lr_part))
        if len(results) == 1:
            return results[0]
        buffers = None
        if results[0].buffers is not None:
            buffers = {k: torch.cat([r.buffers[k] for r in results]) for k in results[0].buffers}
        return CohortResult(torch.cat([r.weights for r in results]), torch.cat([r.loss for r in results]), buffers)

    def _auto_chunk(self, K: int, backend: str, device: torch.device) -> int:
        """Clients per chunk when ``chunk_size`` is None.

        On a CPU the vmap backend trains ``max(1, 2**22 // P)`` clients at a time, so the
        chunk's weights and gradients (``[chunk, P]`` each, 16 MB in float32) stay in the
        cache between steps: a cohort of 100 MLP 2NN clients trains about 1.4x faster in
        chunks of 21 than all at once (benchmarks/engine_throughput.py). Elsewhere (GPUs,
        and the loop backend, which trains one client at a time anyway) the whole cohort.
        """
        if backend == "vmap" and device.type == "cpu":
            return max(1, min(K, (1 << 22) // max(self.layout.num_params, 1)))
        return max(K, 1)

    def _train_vmap(self, w_start, data_x, data_y, index, positions, valid, steps, rule, lr) -> CohortResult:
        """All K clients at once, one ``vmap(grad)`` call per local step.

        Clients are ordered by steps done (most first), so the clients still active at step
        ``t`` are a prefix of the cohort and every step reads and updates views of ``[K, P]``
        in place: no per-step gather, scatter or new ``[K, P]`` tensor.
        """
        K, T = index.shape[0], positions.shape[1]
        order = None
        per_row = isinstance(lr, Tensor)
        if per_row:  # most steps first, then rows of one learning rate together (contiguous runs)
            key = torch.unique(lr, return_inverse=True)[1]
            order = torch.sort(key, stable=True).indices
            order = order[torch.sort(steps[order], descending=True, stable=True).indices]
            if bool((order == torch.arange(K)).all()):
                order = None
        elif K > 1 and bool((steps[1:] > steps[:-1]).any()):
            order = torch.sort(steps, descending=True, stable=True).indices
        if order is not None:
            steps = steps[order]
            dev_order = order.to(index.device)
            index, positions, valid = index[dev_order], positions[dev_order], valid[dev_order]
            rule = rule.select(order.to(w_start.device), K)
            if w_start.dim() == 2:
                w_start = w_start[order.to(w_start.device)]
            if per_row:
                lr = lr[order]
        runs = _lr_runs(lr) if per_row else [(0, K, lr)]
        active = [int(a) for a in (steps[None, :] > torch.arange(T)[:, None]).sum(1)] if T else []
        W = w_start.expand(K, -1).clone() if w_start.dim() == 1 else w_start.clone()
        views = self.layout.unflatten(W)  # {name: [K, *shape]}, views of W
        names = list(views)
        loss_sum = torch.zeros(K, dtype=W.dtype, device=W.device)
        buffers = self._buffers()
        B = positions.shape[2] if positions.dim() == 3 else 0
        ex = index.gather(1, positions.reshape(K, T * B)).view(K, T, B) if T else positions  # global example ids
        mask_all = valid.to(W.dtype)
        plain = _is_plain(rule)
        term = rule.loss_term
        for t in range(T):
            n = active[t]
            if n == 0:
                break
            ids = ex[:n, t]
            params = {k: v[:n] for k, v in views.items()} if n < K else views
            if term is None:
                g, loss = self._step(params, data_x[ids], data_y[ids], mask_all[:n, t], buffers, n == K)
            else:  # a loss term: the eager vmapped step (its function is not part of a recorded graph's key)
                aux = term.aux if n == K else _pick_rows(term.aux, slice(0, n), K)
                g, loss = self._vmapped_term(params, data_x[ids], data_y[ids], mask_all[:n, t], buffers, term.fn, aux)
            if plain:
                for a, b, lr_ in runs:  # one run of rows per learning rate (one run when lr is a float)
                    if a >= n:
                        break
                    b = min(b, n)
                    whole_run = a == 0 and b == n
                    torch._foreach_add_([params[k] if whole_run else params[k][a:b] for k in names],
                                        [g[k] if whole_run else g[k][a:b] for k in names], alpha=-lr_)
            else:
                d = (rule.select(slice(0, n), K) if n < K else rule).direction_(self.layout.flatten(g), W[:n])
                for a, b, lr_ in runs:
                    if a >= n:
                        break
                    b = min(b, n)
                    W[a:b].add_(d[a:b], alpha=-lr_)
            loss_sum[:n] += loss.detach()
        loss = loss_sum / steps.clamp_min(1).to(W.device, W.dtype)
        if order is not None:
            inverse = torch.argsort(order).to(W.device)
            W, loss = W[inverse], loss[inverse]
        return CohortResult(W, loss)

    def _step(self, params, x, y, mask, buffers, whole: bool):
        """One vmapped local step: the recorded graph when there is one for these inputs, else eager."""
        if not (whole and self.trace):
            return self._vmapped(params, x, y, mask, buffers)
        key = (
            tuple((k, tuple(v.shape), v.dtype) for k, v in params.items()),
            tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, mask.dtype, x.device,
            tuple((k, tuple(b.shape), b.dtype) for k, b in buffers.items()), self.net.training,
        )
        fn = self._traced.get(key)
        if fn is not None and not _has_hooks(self.net):
            return fn(params, x, y, mask, buffers)
        if fn is not None or key in self._traced or _has_hooks(self.net):
            return self._vmapped(params, x, y, mask, buffers)
        return self._record(key, params, x, y, mask, buffers)

    def _record(self, key, params, x, y, mask, buffers):
        """Record the step for ``key`` and check it against the eager step; return the eager result."""
        from torch.fx.experimental.proxy_tensor import make_fx

        def step(params, x, y, mask, buffers):
            return self._vmapped(params, x, y, mask, buffers)

        rng = _rng_state(x.device)
        expected = self._vmapped(params, x, y, mask, buffers)
        after = _rng_state(x.device)
        try:
            _set_rng_state(rng, x.device)
            graph = make_fx(step)(params, x, y, mask, buffers)
            _set_rng_state(rng, x.device)
            got = graph(params, x, y, mask, buffers)
            same = all(torch.equal(a, b) for a, b in zip(_leaves(expected), _leaves(got)))
        except Exception:  # noqa: BLE001 - anything make_fx cannot record runs eagerly
            graph, same = None, False
        _set_rng_state(after, x.device)
        if len(self._traced) >= 16:  # a bounded cache: shapes change rarely (chunks, datasets)
            self._traced.pop(next(iter(self._traced)))
        self._traced[key] = graph if same else None
        return expected

    def _work_net(self) -> nn.Module:
        """The loop backend's copy of ``net`` (same device and dtype), made on first use.

        Its trainable parameters are pointed at rows of the cohort's ``[K, P]`` weights, so a
        local step is an ordinary forward and backward through the module (no
        ``functional_call`` swap per step) and an in-place update of that row.
        """
        like = next(self.net.parameters())
        work = self._work
        if work is None or (w := next(work.parameters())).device != like.device or w.dtype != like.dtype:
            work = copy.deepcopy(self.net)
            for p in work.parameters():
                p.requires_grad_(False)
            self._work = work
        work.train(self.net.training)
        return work

    def _train_loop(self, w_start, data_x, data_y, index, positions, valid, steps, rule, lr) -> CohortResult:
        """One client after another with ordinary autograd through a private copy of ``net``."""
        K, T = index.shape[0], positions.shape[1]
        work = self._work_net()
        own = dict(work.named_parameters())
        params = [own[n] for n in self.layout.names]
        work_buffers = dict(work.named_buffers())
        base_buffers = self._buffers()
        track = has_running_stats(self.net)
        with torch.no_grad():
            for name, b in base_buffers.items():
                work_buffers[name].copy_(b)
        W = w_start.expand(K, -1).clone() if w_start.dim() == 1 else w_start.clone()
        rates = lr.tolist() if isinstance(lr, Tensor) else [lr] * K
        counts = valid.sum(-1).cpu().tolist() if T else [[] for _ in range(K)]  # valid examples lead each batch
        B = positions.shape[2] if positions.dim() == 3 else 0
        ex = index.gather(1, positions.reshape(K, T * B)).view(K, T, B) if T else positions
        plain = _is_plain(rule)
        term = rule.loss_term
        losses, client_buffers = torch.zeros(K, dtype=W.dtype, device=W.device), []
        try:
            for k in range(K):
                s_k = int(steps[k])
                rows = self.layout.unflatten(W[k])
                for p, name in zip(params, self.layout.names):
                    p.data = rows[name]  # the module now computes with client k's weights, in place
                    p.requires_grad_(True)
                if track and k > 0:
                    with torch.no_grad():
                        for name, b in base_buffers.items():
                            work_buffers[name].copy_(b)
                rule_k = None if plain else rule.select(k, K)
                aux_k = None if term is None else term.client(k)
                weights_k = [rows[name] for name in self.layout.names]  # the parameters' storage, for in-place steps
                loss_sum = W.new_zeros(())
                for t in range(s_k):
                    if t % _LOOP_GATHER_STEPS == 0:  # the next steps' batches in one gather ([steps, B, ...])
                        xs, ys = data_x[ex[k, t : t + _LOOP_GATHER_STEPS]], data_y[ex[k, t : t + _LOOP_GATHER_STEPS]]
                    c, i = counts[k][t], t % _LOOP_GATHER_STEPS  # step t uses the first c (valid) rows of its batch
                    x_t, y_t = (xs[i], ys[i]) if c == B else (xs[i, :c], ys[i, :c])
                    if term is None:
                        loss = self.loss_fn(work(x_t), y_t).mean()
                    else:
                        out = work(x_t)
                        per_example = per_example_mean(self.loss_fn(out, y_t))
                        loss = (per_example + term.fn(dict(zip(self.layout.names, params)), out, x_t, y_t, aux_k)).mean()
                    grads = torch.autograd.grad(loss, params)
                    with torch.no_grad():
                        if plain:
                            torch._foreach_add_(weights_k, list(grads), alpha=-rates[k])
                        else:
                            _apply_step_(W[k], torch.cat([g.reshape(-1) for g in grads]), rule_k, rates[k])
                    loss_sum += loss.detach()
                losses[k] = loss_sum / max(s_k, 1)
                if track:
                    client_buffers.append({n: work_buffers[n].clone() for n in base_buffers})
        finally:
            for p in params:  # let go of the cohort's weights
                p.requires_grad_(False)
                p.data = p.data.clone()
        stacked = None
        if track:
            stacked = {n: torch.stack([b[n] for b in client_buffers]) for n in base_buffers}
        return CohortResult(W, losses, stacked)
