"""The ``loop`` backend: one client after another with ordinary autograd.

For models that cannot be vmapped (cuDNN RNNs, custom kernels) and as the reference of the vmap backend: the loop
backend trains a private copy of ``net`` whose parameters point at each client's row of the
cohort's ``[K, P]`` weights, and returns each client's buffers when the model has running
statistics (:func:`has_running_stats`).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from lfed.engine.example_dp import clip_and_sum
from lfed.engine.losses import per_example_mean
from lfed.engine.norm import has_running_stats
from lfed.engine.precision import local_autocast
from lfed.engine.result import CohortResult
from lfed.engine.rule import _apply_step_, _is_plain, term_per_example
from lfed.engine.term import TermModel

#: The loop backend gathers this many steps' mini-batches at once (fewer small indexing operations per step).
_LOOP_GATHER_STEPS = 32


class LoopBackend:
    """The loop backend (a part of :class:`~lfed.engine.CohortTrainer`).

    Uses the trainer's ``net``, ``loss_fn``, ``layout``, ``_buffers()`` and ``_work`` (the
    private copy of ``net``, made on first use).
    """

    def _work_net(self) -> nn.Module:
        """The loop backend's copy of ``net`` (same device and dtype), made on first use.

        Its trainable parameters are pointed at rows of the cohort's ``[K, P]`` weights (its frozen
        parameters are ``net``'s own tensors, shared, not copied), so a local step is an ordinary forward and backward through the module (no
        ``functional_call`` swap per step) and an in-place update of that row.
        """
        like = next(self.net.parameters())
        work = self._work
        if work is None or (w := next(work.parameters())).device != like.device or w.dtype != like.dtype:
            # the frozen parameters (a frozen base) are not copied: the copy shares them with ``net``, so
            # the base is once on the device and a base loaded into ``net`` later is the one it computes with
            trainable = set(self.layout.names)
            shared = {id(p): p for n, p in self.net.named_parameters() if n not in trainable}
            work = copy.deepcopy(self.net, memo=shared)
            for p in work.parameters():
                p.requires_grad_(False)
            self._work = work
        work.train(self.net.training)
        return work

    def _example_dp_grads(self, work: nn.Module, params: list[Tensor], x: Tensor, y: Tensor, dp, k: int
                          ) -> tuple[list[Tensor], Tensor]:
        """Client ``k``'s DP-SGD gradient of one step (:mod:`lfed.engine.example_dp`), the reference form: one
        ordinary backward per example, each clipped, their sum noised from the client's own stream and divided by the
        expected batch; and the batch's mean loss (0 for an empty Poisson batch)."""
        per_example: list[tuple[Tensor, ...]] = []
        losses = []
        for i in range(x.shape[0]):
            with local_autocast():
                loss_i = per_example_mean(self.loss_fn(work(x[i : i + 1]), y[i : i + 1])).sum()
            per_example.append(torch.autograd.grad(loss_i, params))
            losses.append(loss_i.detach())
        if per_example:
            stacked = {name: torch.stack([g[j] for g in per_example]) for j, name in enumerate(self.layout.names)}
            mask = torch.ones(x.shape[0], dtype=params[0].dtype, device=params[0].device)
            summed = self.layout.flatten(clip_and_sum(stacked, mask, dp.clip))
            loss = torch.stack(losses).mean()
        else:  # nobody sampled: the step is noise alone
            summed = params[0].new_zeros(self.layout.num_params)
            loss = params[0].new_zeros(())
        flat = dp.select(k, None).finish(summed[None])[0]
        return list(self.layout.unflatten(flat).values()), loss

    def _train_loop(self, w_start, data_x, data_y, index, positions, valid, steps, rule, lr, buffers=None,
                    augment=None) -> CohortResult:
        """One client after another with ordinary autograd through a private copy of ``net``.

        ``buffers``: ``{name: [K, *shape]}`` each client's own start values of these buffers (None: the net's).
        ``augment``: ``(augmentation, {name: [K, T, B', ...]})``: each step's batch transformed with its examples' draws.
        """
        K, T = index.shape[0], positions.shape[1]
        work, params, work_buffers, base_buffers = self._work_copy()
        track = has_running_stats(self.net)
        W = w_start.expand(K, -1).clone() if w_start.dim() == 1 else w_start.clone()
        rates = lr.tolist() if isinstance(lr, Tensor) else [lr] * K
        counts = valid.sum(-1).cpu().tolist() if T else [[] for _ in range(K)]  # valid examples lead each batch
        B = positions.shape[2] if positions.dim() == 3 else 0
        ex = index.gather(1, positions.reshape(K, T * B)).view(K, T, B) if T else positions
        plain = _is_plain(rule)
        term = rule.loss_term
        dp = rule.example_dp  # example-level DP-SGD (lfed.engine.example_dp)
        losses, client_buffers = torch.zeros(K, dtype=W.dtype, device=W.device), []
        try:
            for k in range(K):
                s_k = int(steps[k])
                rows = self.layout.unflatten(W[k])
                for p, name in zip(params, self.layout.names):
                    p.data = rows[name]  # the module now computes with client k's weights, in place
                    p.requires_grad_(True)
                if (track and k > 0) or buffers is not None:
                    with torch.no_grad():
                        for name, b in base_buffers.items():
                            work_buffers[name].copy_(b if buffers is None or name not in buffers else buffers[name][k])
                rule_k = None if plain else rule.select(k, K)
                aux_k = None if term is None else term.client(k)
                weights_k = [rows[name] for name in self.layout.names]  # the parameters' storage, for in-place steps
                loss_sum = W.new_zeros(())
                for t in range(s_k):
                    if t % _LOOP_GATHER_STEPS == 0:  # the next steps' batches in one gather ([steps, B, ...])
                        xs, ys = data_x[ex[k, t : t + _LOOP_GATHER_STEPS]], data_y[ex[k, t : t + _LOOP_GATHER_STEPS]]
                    c, i = counts[k][t], t % _LOOP_GATHER_STEPS  # step t uses the first c (valid) rows of its batch
                    x_t, y_t = (xs[i], ys[i]) if c == B else (xs[i, :c], ys[i, :c])
                    if augment is not None:
                        x_t = augment[0].apply(x_t, {name: v[k, t, :c] for name, v in augment[1].items()})
                    if dp is not None:  # example-level DP-SGD: each example's gradient, clipped, summed, noised
                        grads, loss = self._example_dp_grads(work, params, x_t, y_t, dp, k)
                        with torch.no_grad():
                            if plain:
                                torch._foreach_add_(weights_k, list(grads), alpha=-rates[k])
                            else:
                                _apply_step_(W[k], torch.cat([g.reshape(-1) for g in grads]), rule_k, rates[k])
                        loss_sum += loss
                        continue
                    with local_autocast():  # a round's mixed precision: the forward and loss (lfed.engine.precision)
                        if term is None:
                            loss = self.loss_fn(work(x_t), y_t).mean()
                        else:
                            named = dict(zip(self.layout.names, params))
                            if term.wants_model:  # the term reads a representation or runs the net with other rows
                                model = TermModel(work, self.layout, work_buffers, term.layer)
                                out, model.features = model.forward(named, x_t)
                                extra = term.fn(named, out, x_t, y_t, aux_k, model)
                            else:
                                out = work(x_t)
                                extra = term.fn(named, out, x_t, y_t, aux_k)
                            loss = (per_example_mean(self.loss_fn(out, y_t)) + term_per_example(extra, x_t.shape[0])).mean()
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
            _let_go(params)
        stacked = {n: torch.stack([b[n] for b in client_buffers]) for n in base_buffers} if track else None
        return CohortResult(W, losses, stacked)

    def _work_copy(self) -> tuple[nn.Module, list[Tensor], dict[str, Tensor], dict[str, Tensor]]:
        """``(work, params, work_buffers, base_buffers)``: the private copy of the net the loop trains, its parameters
        in the layout's order, its buffers (set to the net's) and the net's own buffers."""
        work = self._work_net()
        own = dict(work.named_parameters())
        params = [own[n] for n in self.layout.names]
        work_buffers = dict(work.named_buffers())
        base_buffers = self._buffers()
        with torch.no_grad():
            for name, b in base_buffers.items():
                work_buffers[name].copy_(b)
        return work, params, work_buffers, base_buffers


def _let_go(params: list[Tensor]) -> None:
    """After the cohort: the work copy's parameters hold copies, not views of the cohort's weights."""
    for p in params:
        p.requires_grad_(False)
        p.data = p.data.clone()
