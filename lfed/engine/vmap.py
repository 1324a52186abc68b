"""The ``vmap`` backend: all K clients at once, one ``vmap(grad(loss))`` call per local step.

The K clients' parameters are one ``[K, P]`` tensor; each local step runs over the stacked
parameters and a gathered ``[K, B, ...]`` batch (recorded and replayed where it can be:
:mod:`lfed.engine.recorded`). Clients that completed fewer steps (stragglers) drop out of the
computation of later steps. The client losses run the net's convolutions in the form
:mod:`lfed.engine.conv` chooses, and under a round's mixed precision (:mod:`lfed.engine.precision`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from lfed.engine.conv import CONV_FORMS, choose_form, conv_forms
from lfed.engine.example_dp import clip_and_sum
from lfed.engine.host import to_device
from lfed.engine.losses import per_example_mean
from lfed.engine.norm import batch_norms, running_stat_names
from lfed.engine.precision import local_autocast
from lfed.engine.recorded import RecordedStep
from lfed.engine.result import CohortResult
from lfed.engine.rule import LossTerm, _is_plain, _pick_rows, term_per_example
from lfed.engine.term import TermModel


def _lr_runs(lr: Tensor) -> list[tuple[int, int, float]]:
    """``[(start, stop, value)]``: the runs of equal values of a per-row learning rate ``[K]``."""
    values = lr.tolist()
    runs, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((start, i, values[start]))
            start = i
    return runs


class VmapBackend(RecordedStep):
    """The vmap backend (a part of :class:`~lfed.engine.CohortTrainer`).

    Uses the trainer's ``net``, ``loss_fn``, ``layout``, ``_buffers()`` and ``_vmapped`` /
    ``_vmapped_term`` (``vmap(grad_and_value(...))`` of the client losses below).

    The client losses run the net's ``Conv1d`` / ``Conv2d`` in the form :mod:`lfed.engine.conv`
    chooses: ``conv_form`` ``"auto"`` (the default; the environment variable ``LFED_CONV_FORM``
    may name a form instead) takes the device's rule (:func:`~lfed.engine.conv.choose_form`);
    ``"matmul"`` or ``"native"`` force one form.
    """

    #: ``"auto"``, ``"matmul"`` or ``"native"`` (:data:`lfed.engine.conv.CONV_FORMS`): the form of the convolutions.
    conv_form: str = "auto"

    def _conv_setting(self) -> str:
        """``conv_form``, or ``LFED_CONV_FORM`` where it is ``"auto"`` and the variable is set."""
        setting = self.conv_form
        if setting == "auto":
            setting = os.environ.get("LFED_CONV_FORM", "") or "auto"
        if setting not in CONV_FORMS:
            raise ValueError(f"conv_form / LFED_CONV_FORM: {setting!r} is not one of {CONV_FORMS}")
        return setting

    def _conv_choice(self, module: Any, x: Tensor, weight: Tensor) -> str:
        """The form of one convolution: forced by :meth:`_conv_setting`, else the device's rule (:func:`choose_form`)."""
        setting = self._conv_setting()
        return choose_form(x.device) if setting == "auto" else setting

    def _forward(self, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor) -> Tensor:
        """The net on ``x`` with ``params`` and ``buffers``, its convolutions in the chosen form."""
        with conv_forms(self.net, self._conv_choice):
            return functional_call(self.net, (params, buffers), (x,))

    def _client_loss(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor, buffers: dict[str, Tensor]
    ) -> Tensor:
        with local_autocast():  # a round's mixed precision: the forward and loss (lfed.engine.precision)
            out = self._forward(params, buffers, x)
            per_example = per_example_mean(self.loss_fn(out, y))
        return (per_example * mask).sum() / mask.sum().clamp_min(1)

    def _client_loss_with_term(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor, buffers: dict[str, Tensor],
        term: LossTerm, aux: Any,
    ) -> Tensor:
        with local_autocast(), conv_forms(self.net, self._conv_choice):
            if term.wants_model:  # the term reads a representation or runs the net with other rows
                model = TermModel(self.net, self.layout, buffers, term.layer)
                out, model.features = model.forward(params, x)
                extra = term.fn(params, out, x, y, aux, model)
            else:
                out = functional_call(self.net, (params, buffers), (x,))
                extra = term.fn(params, out, x, y, aux)
            per_example = per_example_mean(self.loss_fn(out, y)) + term_per_example(extra, x.shape[0])
        return (per_example * mask).sum() / mask.sum().clamp_min(1)

    def _client_dp_grad(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor, buffers: dict[str, Tensor], clip: float
    ) -> tuple[dict[str, Tensor], Tensor]:
        """One client's clipped sum of per-example gradients (:mod:`lfed.engine.example_dp`) and its mean loss: the
        per-example gradients are one more ``vmap`` inside the cohort's, over the batch's examples."""

        def one(p: dict[str, Tensor], x1: Tensor, y1: Tensor) -> Tensor:
            with local_autocast():
                out = self._forward(p, buffers, x1.unsqueeze(0))
                return per_example_mean(self.loss_fn(out, y1.unsqueeze(0))).sum()

        grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0), randomness="different")(params, x, y)
        summed = clip_and_sum(grads, mask, clip)
        return summed, (losses * mask).sum() / mask.sum().clamp_min(1)

    def _client_loss_stats(
        self, params: dict[str, Tensor], x: Tensor, y: Tensor, mask: Tensor, buffers: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`_client_loss` of a net with BatchNorm (:mod:`lfed.engine.norm`): the loss and the updated statistics."""
        stats: dict[str, Tensor] = {}
        with batch_norms(self.net, mask, stats):
            loss = self._client_loss(params, x, y, mask, buffers)
        return loss, stats

    def _client_loss_with_term_stats(self, params, x, y, mask, buffers, term, aux) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`_client_loss_with_term` of a net with BatchNorm: the loss and the updated statistics."""
        stats: dict[str, Tensor] = {}
        with batch_norms(self.net, mask, stats):
            loss = self._client_loss_with_term(params, x, y, mask, buffers, term, aux)
        return loss, stats

    def _train_vmap(self, w_start, data_x, data_y, index, positions, valid, steps, rule, lr, buffers=None,
                    augment=None) -> CohortResult:
        """All K clients at once, one ``vmap(grad)`` call per local step.

        Clients are ordered by steps done (most first), so the clients still active at step
        ``t`` are a prefix of the cohort and every step reads and updates views of ``[K, P]``
        in place: no per-step gather, scatter or new ``[K, P]`` tensor. A net with BatchNorm
        carries every row's buffers the same way (``{name: [K, ...]}``; ``buffers``: some rows'
        start values, else the net's), updated by each row's steps only, and returns them when
        it has running statistics (:mod:`lfed.engine.norm`).
        """
        K, T = index.shape[0], positions.shape[1]
        per_row = isinstance(lr, Tensor)
        order = _step_order(steps, lr if per_row else None)
        if order is not None:
            steps, index, positions, valid, rule, w_start, lr, buffers, augment = _reordered(
                order, steps, index, positions, valid, rule, w_start, lr, buffers, augment)
        runs = _lr_runs(lr) if per_row else [(0, K, lr)]
        active = (steps[None, :] > torch.arange(T)[:, None]).sum(1).tolist() if T else []  # host values
        W = w_start.expand(K, -1).clone() if w_start.dim() == 1 else w_start.clone()
        views = self.layout.unflatten(W)  # {name: [K, *shape]}, views of W
        names = list(views)
        loss_sum = torch.zeros(K, dtype=W.dtype, device=W.device)
        norm = self.batch_norm
        buffers = self._row_buffers(K, buffers) if norm else self._buffers()
        stat_names = running_stat_names(self.net) if norm else []
        B = positions.shape[2] if positions.dim() == 3 else 0
        ex = index.gather(1, positions.reshape(K, T * B)).view(K, T, B) if T else positions  # global example ids
        mask_all = valid.to(W.dtype)
        plain = _is_plain(rule)
        term = rule.loss_term
        dp = rule.example_dp  # example-level DP-SGD (lfed.engine.example_dp): each row's generators in the rows' order
        widths = _dp_widths(dp, active) if dp is not None and T else []
        for t in range(T):
            n = active[t]
            if n == 0:
                break
            ids = ex[:n, t]
            params = {k: v[:n] for k, v in views.items()} if n < K else views
            rows = ({k: v[:n] for k, v in buffers.items()} if n < K else buffers) if norm else buffers
            x = data_x[ids]
            if augment is not None:  # this step's batch of every active row, with its examples' own draws
                x = augment[0].apply(x, {k: v[:n, t] for k, v in augment[1].items()})
            if dp is not None:  # clipped per-example sums, then each row's own noise and the expected batch
                width = widths[t]  # this step's largest Poisson batch (the sampled examples lead each row)
                g, loss = self._vmapped_dp(params, x[:, :width], data_y[ids[:, :width]], mask_all[:n, t, :width], rows,
                                           dp.clip)
                g = self.layout.unflatten(dp.finish(self.layout.flatten(g)))
            elif term is None:
                g, loss = self._step(params, x, data_y[ids], mask_all[:n, t], rows, n == K, stats=norm)
            else:  # a loss term: the eager vmapped step (its function is not part of a recorded graph's key)
                aux = term.aux if n == K else _pick_rows(term.aux, slice(0, n), K)
                if norm:
                    vmapped = self._vmapped_term_stats if aux is not None else self._vmapped_term_no_aux_stats
                else:
                    vmapped = self._vmapped_term if aux is not None else self._vmapped_term_no_aux  # aux=None: nothing per client
                g, loss = vmapped(params, x, data_y[ids], mask_all[:n, t], rows, term, aux)
            if norm:  # (loss, the rows' updated running statistics): each active row's own buffers move on, in one call
                loss, new = loss
                if new:  # (none for BatchNorm without running statistics)
                    torch._foreach_copy_([rows[name] for name in new], list(new.values()))
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
        loss = loss_sum / to_device(steps.clamp_min(1), W.device).to(W.dtype)
        return _in_cohort_order(W, loss, buffers, stat_names, order)


def _step_order(steps: Tensor, lr: Tensor | None) -> Tensor | None:
    """The order :meth:`VmapBackend._train_vmap` trains the rows in, or None when they are in it already: most steps
    first (the rows still active at a step are a prefix), and with a per-row ``lr`` the rows of one learning rate
    together (contiguous runs)."""
    K = steps.numel()
    if lr is not None:
        key = torch.unique(lr, return_inverse=True)[1]
        order = torch.sort(key, stable=True).indices
        order = order[torch.sort(steps[order], descending=True, stable=True).indices]
        return None if torch.equal(order, torch.arange(K)) else order
    if K > 1 and (steps[1:] > steps[:-1]).any().tolist():  # steps: on the host (the engine's copy)
        return torch.sort(steps, descending=True, stable=True).indices
    return None


def _reordered(order: Tensor, steps, index, positions, valid, rule, w_start, lr, buffers, augment) -> tuple:
    """Every per-row input of :meth:`VmapBackend._train_vmap` in ``order`` (each on its own device)."""
    K = index.shape[0]
    steps = steps[order]
    dev_order = to_device(order, index.device)
    index, positions, valid = index[dev_order], positions[dev_order], valid[dev_order]
    rule = rule.select(to_device(order, w_start.device), K)
    if w_start.dim() == 2:
        w_start = w_start[to_device(order, w_start.device)]
    if isinstance(lr, Tensor):
        lr = lr[order]
    if buffers is not None:
        buffers = {name: b[to_device(order, b.device)] for name, b in buffers.items()}
    if augment is not None:
        augment = (augment[0], {k: v[dev_order] for k, v in augment[1].items()})
    return steps, index, positions, valid, rule, w_start, lr, buffers, augment


def _dp_widths(dp, active: list[int]) -> list[int]:
    """DP-SGD: each step's largest realised batch among its active rows (at least 1), host values."""
    return [max(int(dp.counts[: active[t], t].max()), 1) if active[t] else 1 for t in range(len(active))]


def _in_cohort_order(W: Tensor, loss: Tensor, buffers: dict[str, Tensor], stat_names: list[str],
                     order: Tensor | None) -> CohortResult:
    """The trained rows back in the cohort's order, with every buffer per row when the net has running statistics
    (as the loop backend returns them)."""
    out = None
    if stat_names:
        out = {name: b if name in stat_names else b.clone() for name, b in buffers.items()}
    if order is not None:
        inverse = to_device(torch.argsort(order), W.device)
        W, loss = W[inverse], loss[inverse]
        if out is not None:
            out = {name: b[inverse.to(b.device)] for name, b in out.items()}
    return CohortResult(W, loss, out)
