"""Evaluation of the global model (docs/algorithms.md §9).

* :func:`evaluate_split`: the test loss (mean per-example loss, whatever form the user's loss
  takes) and, for classification, the test accuracy of a split, summed in float64 batch after
  batch, each rank its contiguous share, the sums reduced over the ranks (no item twice).
* :func:`client_accuracies`, :func:`client_evaluation`: the global model's accuracy (and NLL) on each
  client's held-out split.
* :func:`local_accuracy` and :class:`BestMeanAccuracy`: BMTA (004 §5) in its two readings,
  ``bmta_global`` and ``bmta_local`` (docs/algorithms.md §9).
* :func:`check_task` (from :mod:`lfed.evaluation.task`): the net's output against the data's task (number of
  classes, or the regression target's shape), one forward pass before round 0.

Every function here runs the net in evaluation mode (:func:`evaluating`), whatever mode the caller left it in,
and puts each module's mode back after: BatchNorm normalises with its running statistics and writes none, dropout
is off. So an evaluation reads the same whoever drives the run (Lightning's validation loop, which calls
``eval()`` itself, or :func:`lfed.core.fit.fit_run`, which does not) and leaves the model as it found it.

The task is read from the targets: integer targets are class labels (classification: loss and
accuracy), floating targets are regression targets (loss only).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lfed.engine.host import values
from lfed.engine.norm import evaluating
from lfed.evaluation.task import check_task, is_classification, output_shape_is_known

# check_task, is_classification, output_shape_is_known: from lfed.evaluation.task, importable from here too
__all__ = [
    "accuracy_summary", "BestMeanAccuracy", "check_task", "client_accuracies", "client_evaluation",
    "client_losses", "evaluate_split", "is_classification", "local_accuracy", "output_shape_is_known",
    "own_split_scores", "per_example_loss", "perplexity_summary", "personal_accuracies", "personal_scores",
    "sample_mean_se", "worst_share_mean",
]  # fmt: skip

LossFn = Callable[[Tensor, Tensor], Tensor]


def per_example_loss(loss_fn: LossFn, out: Tensor, y: Tensor) -> Tensor:
    """The loss of each example of a batch, ``[B]``, whatever the form of ``loss_fn``.

    ``loss_fn`` may return one value per example (``reduction='none'``, possibly with trailing
    dimensions, which are averaged: a per-example mean squared error over the outputs), or one
    reduced value for the batch (a plain ``F.cross_entropy``, a lambda with ``.mean()`` or
    ``.sum()``). A reduced loss is evaluated example by example, where mean and sum agree.

    Args:
        loss_fn: ``(output, target) -> loss``.
        out: ``[B, ...]`` outputs of the net.
        y: ``[B, ...]`` targets.
    """
    from lfed.engine import as_per_example_loss, per_example_mean

    return per_example_mean(as_per_example_loss(loss_fn)(out, y))


@torch.no_grad()
def evaluate_split(net: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, ranks, reduce_sum: Callable[[Tensor], Tensor],
                   batch_size: int, classification: bool) -> dict[str, float]:
    """``{"test/loss", "test/acc"}`` of ``net`` on ``(x, y)``: each rank its contiguous share, sums reduced.

    The per-example losses (:func:`per_example_loss`) and correct predictions are summed in
    float64 batch after batch, then over the ranks (``reduce_sum``), so each example counts once;
    a NaN loss stays NaN. Every rank must call it (a collective with several ranks).

    Args:
        ranks: The processes (:class:`lfed.engine.ranks.Ranks`): this rank evaluates ``ranks.share(n)``.
        reduce_sum: Sum of a tensor over the ranks (the identity with one).
        batch_size: Examples per forward pass.
        classification: Whether to count accuracy.
    """
    dtype = next(net.parameters()).dtype
    sums = torch.zeros(3, dtype=torch.float64, device=x.device)  # loss sum, correct, examples
    lo, hi = ranks.share(x.shape[0])
    with evaluating(net):  # running statistics, not each batch's; none written (module docstring)
        for start in range(lo, hi, batch_size):
            xb, yb = x[start : min(start + batch_size, hi)], y[start : min(start + batch_size, hi)]
            out = net(xb.to(dtype) if xb.is_floating_point() else xb)
            if not classification:
                yb = yb.to(out.dtype)
            losses = per_example_loss(loss_fn, out, yb).double()
            correct = (out.argmax(-1) == yb).double().sum() if classification else losses.new_zeros(())
            sums += torch.stack([losses.sum(), correct, losses.new_tensor(float(losses.numel()))])
    sums = reduce_sum(sums)
    metrics = {"test/loss": float(sums[0] / sums[2])}
    if classification:
        metrics["test/acc"] = float(sums[1] / sums[2])
    return metrics


@torch.no_grad()
def client_losses(engine, w: Tensor, data_x: Tensor, data_y: Tensor, index: Tensor, num_examples: Tensor, ranks,
                  chunk: int = 4096) -> Tensor:
    """``[K]`` each client's mean loss ``F_k(w)`` over its training examples under the flat weights ``w``.

    Each rank evaluates a contiguous share of the cohort's examples; the per-client sums are
    all-reduced (``ranks``), so every rank returns the same losses. q-FFL's weights read them
    (:attr:`lfed.base.component.Cohort.start_loss`).
    """
    from torch.func import functional_call

    K, m = index.shape
    device = index.device
    valid = torch.arange(m, device=device)[None, :] < num_examples.to(device)[:, None]
    owner = torch.arange(K, device=device)[:, None].expand_as(valid)[valid]
    idx = index[valid]
    params = engine.layout.unflatten(w)
    buffers = dict(engine.net.named_buffers())
    sums = torch.zeros(K, dtype=torch.float64, device=w.device)
    lo, hi = ranks.share(idx.numel())
    with evaluating(engine.net):  # the global model's running statistics, not a chunk's mix of clients; none written
        for a in range(lo, hi, chunk):
            sl = slice(a, min(a + chunk, hi))
            out = functional_call(engine.net, (params, buffers), (data_x[idx[sl]],))
            losses = per_example_loss(engine.loss_fn, out, data_y[idx[sl]]).double()
            sums.index_add_(0, owner[sl].to(sums.device), losses)
    return ranks.all_reduce_sum(sums) / num_examples.to(sums.device, torch.float64).clamp_min(1)


@torch.no_grad()
def client_accuracies(net: nn.Module, data, rank: int, world_size: int, reduce_sum: Callable[[Tensor], Tensor],
                      chunk: int = 4096) -> Tensor | None:
    """Accuracy of the global model on each client's held-out split (:func:`client_evaluation`'s first half)."""
    out = client_evaluation(net, data, rank, world_size, reduce_sum, chunk, nll=False)
    return None if out is None else out[0]


@torch.no_grad()
def client_evaluation(net: nn.Module, data, rank: int, world_size: int, reduce_sum: Callable[[Tensor], Tensor],
                      chunk: int = 4096, nll: bool = True, split: str = "test",
                      clients: Tensor | None = None) -> tuple[Tensor, Tensor | None] | None:
    """Accuracy and mean negative log-likelihood of the global model on each client's held-out split
    (``split='val'``: on each client's own validation split instead).

    Each rank predicts a contiguous share of the held-out examples; ``reduce_sum`` (the strategy's
    ``reduce(..., reduce_op="sum")``) adds the per-client counts and sums over the ranks. The NLL is
    the cross-entropy of the logits (``exp`` of it is the client's perplexity, docs/algorithms.md §12), whatever
    loss the clients train with (``nll=False``: not computed, None; the net's outputs must then be
    logits over the classes only for the accuracy).

    ``clients``: only these clients' splits are scored (a sample, :meth:`lfed.core.run.FederatedRun.client_sample_ids`):
    the work is theirs, not the population's; every other client reads NaN.

    Returns:
        ``([N] accuracies, [N] mean NLL)``, NaN for a client without a held-out split; None when no
        client has one or the task is regression.
    """
    if not is_classification(data.train_y):
        return None
    split_sizes = _sizes(data, split)
    has = split_sizes > 0
    if not bool(has.any()):
        return None
    device = split_sizes.device
    if clients is not None:
        rows = clients.to(device)
        picked = split_sizes[rows]
        split_sizes = torch.zeros_like(split_sizes)
        split_sizes[rows] = picked
        has = split_sizes > 0
        if not bool(has.any()):
            return None
    owner, idx = _positions(data, None if clients is None else rows, split)  # flat: O(the examples)
    correct = torch.zeros(data.num_clients, device=device, dtype=torch.float64)
    nll_sum = torch.zeros(data.num_clients, device=device, dtype=torch.float64) if nll else None
    n = idx.numel()
    start, stop = (n * rank) // world_size, (n * (rank + 1)) // world_size
    with evaluating(net):  # running statistics, not each chunk's; none written (module docstring)
        for lo in range(start, stop, chunk):
            sl = slice(lo, min(lo + chunk, stop))
            logits = net(data.train_x[idx[sl]])
            y = data.train_y[idx[sl]]
            correct.index_add_(0, owner[sl], (logits.argmax(-1) == y).double())
            if nll_sum is not None:
                nll_sum.index_add_(0, owner[sl], F.cross_entropy(logits, y.long(), reduction="none").double())
    correct = reduce_sum(correct)
    sizes = split_sizes[has].double()
    acc = torch.full_like(correct, float("nan"))
    acc[has] = correct[has] / sizes
    mean_nll = None
    if nll_sum is not None:
        nll_sum = reduce_sum(nll_sum)
        mean_nll = torch.full_like(nll_sum, float("nan"))
        mean_nll[has] = nll_sum[has] / sizes
    return acc, mean_nll


def _positions(data, rows: Tensor | None, split: str) -> tuple[Tensor, Tensor]:
    """``(owner, idx)`` of the split's examples of ``rows`` (None: every client), flat
    (:meth:`~lfed.data.built.FederatedData.positions`); from the padded index for another object with the fields."""
    if hasattr(data, "positions"):
        return data.positions(rows, split)
    index = data.holdout_index if split == "test" else data.own_split(split)[0]
    sizes = _sizes(data, split)
    rows = torch.arange(sizes.numel(), device=index.device) if rows is None else rows
    valid = torch.arange(index.shape[1], device=index.device)[None, :] < sizes[rows][:, None]
    return rows[:, None].expand_as(valid)[valid], index[rows][valid]


def _sizes(data, split: str) -> Tensor:
    """``[N]`` the sizes of the clients' own ``split`` (``test``: held out, ``val``: their validation split)."""
    if split == "test":
        return data.holdout_sizes
    if split != "val":
        raise ValueError(f"split: must be 'test' or 'val', got {split!r}")
    if data.client_val_sizes is None:
        raise ValueError("split 'val': the clients hold no validation split (set data.client_validation_fraction)")
    return data.client_val_sizes


def sample_mean_se(values: Tensor, population: int) -> float:
    """The standard error of the mean of ``values``, a simple random sample without replacement of ``population``
    values: ``s/√n · √(1 − n/N)`` (``s`` the sample's standard deviation with ``n − 1``); 0 for the whole population,
    NaN for one value."""
    n = values.numel()
    if n >= population:
        return 0.0
    if n < 2:
        return math.nan
    s = float(values.double().std(unbiased=True))
    return s / math.sqrt(n) * math.sqrt(1 - n / population)


def worst_share_mean(values: Tensor, share: float = 0.1) -> float:
    """Mean of the lowest ``ceil(share * n)`` values (at least one): "worst 10%"."""
    worst = max(1, math.ceil(share * values.numel()))
    return float(values.sort().values[:worst].mean())


@torch.no_grad()
def local_accuracy(net: nn.Module, layout, weights: Tensor, data, clients: Tensor, chunk: int = 64,
                   buffers: dict[str, Tensor] | None = None, split: str = "test",
                   host_clients: Tensor | None = None) -> Tensor:
    """Accuracy of each client's locally trained model ``w_k_end`` on its own held-out split.

    :func:`own_split_scores`'s accuracies (its arguments; ``split``: ``test``, the held-out split, or ``val``).

    Returns:
        ``[K]`` accuracies, NaN for a client without a held-out split.
    """
    return own_split_scores(net, layout, weights, data, clients, chunk, buffers, split, host_clients=host_clients)[0]


def own_split_scores(net: nn.Module, layout, weights: Tensor, data, clients: Tensor, chunk: int = 64,
                     buffers: dict[str, Tensor] | None = None, split: str = "test",
                     nll: bool = False, batch: int | None = None,
                     host_clients: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Accuracy (and mean negative log-likelihood) of each client's own model on the client's own split.

    The ``[K, P]`` weights are evaluated together: the split's examples of the K clients are
    gathered into ``[K, h_max, ...]`` (padded, masked) and one ``vmap`` over the clients runs the
    net, ``chunk`` clients at a time (a net that cannot be vmapped is run client by client).

    Args:
        net: The global model's module (its structure; the weights come from ``weights``).
        layout: The :class:`~lfed.engine.params.ParamLayout` of ``net``.
        weights: ``[K, P]`` the clients' models.
        data: The :class:`~lfed.lightning.datamodule.FederatedData` on the device.
        clients: ``[K]`` client ids.
        buffers: ``{name: [K, ...]}`` each client's own buffers (FedBN's running statistics); None: the net's.
        split: ``test`` (the client's held-out split, ``data.holdout_fraction``) or ``val`` (its own
            validation split, ``data.client_validation_fraction``).
        nll: Also return each client's mean cross-entropy ``-log p(y | x)`` (perplexity = its ``exp``).
        batch: At most this many examples per vmapped call (``C`` clients x ``max(1, batch // C)`` of each
            one's examples); None: every example of the chunk's clients at once. The results are the same.
        host_clients: ``clients`` on the host (a round's :class:`~lfed.base.component.HostCohort`): the split's
            largest size is then read from the data's host copy (:meth:`FederatedData.host`), not the device.

    Returns:
        ``([K] accuracies, [K] mean NLL or None)``, NaN for a client without examples in the split.
    """
    from torch.func import functional_call, vmap

    sizes = _sizes(data, split)[clients]
    K = clients.numel()
    if host_clients is not None and hasattr(data, "host"):  # no device read (lfed.engine.host)
        host_sizes = data.host("holdout_sizes" if split == "test" else "client_val_sizes")
        h = max(values(host_sizes[host_clients]), default=0)
    else:
        h = int(sizes.max()) if K else 0
    acc = torch.full((K,), float("nan"), dtype=torch.float64, device=weights.device)
    mean_nll = acc.clone() if nll else None
    if h == 0:
        return acc, mean_nll
    idx = data.gather(clients, split, host_clients=host_clients)[2][:, :h]  # [K, h]: the chunk's rows, padded with 0
    valid = torch.arange(h, device=idx.device)[None, :] < sizes[:, None]
    dtype = next(net.parameters()).dtype
    correct = torch.zeros(K, dtype=torch.float64, device=weights.device)
    nll_sum = torch.zeros(K, dtype=torch.float64, device=weights.device)

    own = dict(net.named_buffers())

    def logits(w: Tensor, x: Tensor, b: dict[str, Tensor] | None = None) -> Tensor:
        return functional_call(net, (layout.unflatten(w), own if b is None else {**own, **b}), (x,))

    with evaluating(net):
        for lo in range(0, K, chunk):
            sl = slice(lo, min(lo + chunk, K))
            b = None if buffers is None else {n: t[sl] for n, t in buffers.items()}
            width = h if batch is None else max(1, batch // (sl.stop - sl.start))
            for at in range(0, h, width):
                cols = slice(at, min(at + width, h))
                x = data.train_x[idx[sl, cols]]
                x = x.to(dtype) if x.is_floating_point() else x
                try:
                    out = vmap(logits)(weights[sl], x) if b is None else vmap(logits)(weights[sl], x, b)
                except Exception:  # a net vmap cannot run: one client after another
                    out = torch.stack([logits(w, x[i], None if b is None else {n: t[i] for n, t in b.items()})
                                       for i, w in enumerate(weights[sl])])
                y, ok = data.train_y[idx[sl, cols]], valid[sl, cols]
                correct[sl] += ((out.argmax(-1) == y) & ok).double().sum(1)
                if nll:
                    lp = torch.log_softmax(out.double(), -1).gather(-1, y[..., None]).squeeze(-1)
                    nll_sum[sl] += torch.where(ok, -lp, torch.zeros_like(lp)).sum(1)
    has, n = sizes > 0, sizes.clamp_min(1).double()  # torch.where, not a boolean mask: no device read
    acc = torch.where(has, correct / n, acc)
    if nll:
        mean_nll = torch.where(has, nll_sum / n, mean_nll)
    return acc, mean_nll


def accuracy_summary(acc: Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}/acc_mean``, ``{prefix}/acc_worst10pct`` (mean of the worst ``ceil(0.1 n)``) and ``{prefix}/acc_std``
    (population standard deviation, ``1/n``) of per-client accuracies ``acc`` (NaN entries left out)."""
    acc = acc[~torch.isnan(acc)].double()
    if acc.numel() == 0:
        return {}
    return {f"{prefix}/acc_mean": float(acc.mean()), f"{prefix}/acc_worst10pct": worst_share_mean(acc, 0.1),
            f"{prefix}/acc_std": float(acc.std(correction=0))}


def perplexity_summary(nll: Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}/perplexity_mean`` (the mean over clients of ``exp(mean NLL)``) and ``{prefix}/perplexity_worst10pct``
    (the mean of the highest ``ceil(0.1 n)``) of per-client mean NLLs ``nll`` (NaN entries left out; docs/algorithms.md §12)."""
    ppl = nll[~torch.isnan(nll)].double().exp()
    if ppl.numel() == 0:
        return {}
    return {f"{prefix}/perplexity_mean": float(ppl.mean()), f"{prefix}/perplexity_worst10pct": -worst_share_mean(-ppl, 0.1)}


def personal_accuracies(net: nn.Module, layout, data, clients: Tensor, rows_of: Callable, chunk: int = 256) -> Tensor:
    """Accuracy of each client's own (personalized) model on its own held-out split (docs/algorithms.md §13).

    :func:`personal_scores` on the ``test`` split, accuracies only.

    Returns:
        ``[S]`` accuracies of ``clients`` (NaN for a client without a held-out split).
    """
    return personal_scores(net, layout, data, clients, rows_of, chunk)["test"][0]


def personal_scores(net: nn.Module, layout, data, clients: Tensor, rows_of: Callable, chunk: int = 256,
                    splits: tuple[str, ...] = ("test",), nll: bool = False,
                    batch: int | None = None) -> dict[str, tuple[Tensor, Tensor | None]]:
    """Accuracy (and mean NLL) of each client's own (personalized) model on its own splits (docs/algorithms.md §13).

    ``clients`` are taken ``chunk`` at a time: ``rows_of(chunk_clients)`` gives their ``[C, P]`` models
    (or ``([C, P], {buffer: [C, ...]})`` with per-client buffers, FedBN's running statistics), made once
    per chunk and evaluated on every split of ``splits`` (:func:`own_split_scores`, one vmapped call per
    split, at most ``batch`` examples per call); so at most ``[chunk, P]`` models exist at once. The rows
    are read under :func:`lfed.state.spec.read_only_rows`: a dense state's rows of a contiguous range of
    clients (the evaluation of every client) are a view of the state, host or disk rows a view of their
    block when stored in consecutive slots (on CUDA copied from pinned memory without blocking), else they go
    through one reused (on CUDA: two pinned, alternating) ``[chunk, P]`` buffer, so nothing of ``[chunk, P]``
    is allocated on the host per chunk; ``rows_of`` must not write into what it reads there.

    Returns:
        ``{split: ([S] accuracies, [S] mean NLL or None)}`` of ``clients`` (NaN for a client without
        examples in the split).
    """
    S = clients.numel()
    out = {s: (torch.full((S,), float("nan"), dtype=torch.float64, device=clients.device),
               torch.full((S,), float("nan"), dtype=torch.float64, device=clients.device) if nll else None)
           for s in splits}
    from lfed.state.spec import read_only_rows

    for lo in range(0, S, chunk):
        part = clients[lo : lo + chunk]
        with read_only_rows():  # the chunk's rows in place where the store can (a view, a reused buffer): no copy
            rows = rows_of(part)
        buffers = None
        if isinstance(rows, tuple):
            rows, buffers = rows
        for split in splits:
            acc, mean_nll = own_split_scores(net, layout, rows.detach(), data, part, buffers=buffers, split=split, nll=nll,
                                             batch=batch)
            out[split][0][lo : lo + part.numel()] = acc.to(clients.device)
            if nll:
                out[split][1][lo : lo + part.numel()] = mean_nll.to(clients.device)
    return out


class BestMeanAccuracy:
    """BMTA of 004 §5 in its two readings (docs/algorithms.md §9), kept over a run and saved in checkpoints.

    * ``bmta_global``: the best, over evaluations, of the mean over the last round's
      participants (with a held-out split) of the global model's accuracy on each one's
      held-out split.
    * ``bmta_local``: the best, over rounds, of the mean over the round's participants whose
      work counts (with a held-out split) of each one's locally trained model ``w_k_end`` on
      its own held-out split.

    Attributes:
        best_global: Best value so far of the ``bmta_global`` mean (None before any).
        best_local: Best value so far of the ``bmta_local`` mean (None before any).
        last_cohort: Client ids of the last round's cohort (on the CPU), or None.
    """

    def __init__(self) -> None:
        self.best_global: float | None = None
        self.best_local: float | None = None
        self.last_cohort: Tensor | None = None

    @staticmethod
    def _mean(values: Tensor) -> float | None:
        values = values[~torch.isnan(values)]
        return float(values.mean()) if values.numel() else None

    def add_round(self, clients: Tensor, local: Tensor | float | None) -> float | None:
        """Record a round's cohort and the local accuracies of its counting participants; the round's mean.

        ``local``: the ``[K']`` accuracies (NaN: no held-out split), or their mean already read (a float;
        :meth:`lfed.core.run.FederatedRun.conclude` reads it with the round's metrics), or None.
        """
        self.last_cohort = clients.detach().cpu()
        mean = self._mean(local) if isinstance(local, Tensor) else local
        if mean is not None and (self.best_local is None or mean > self.best_local):
            self.best_local = mean
        return mean

    def add_round_metrics(self, clients: Tensor, metrics: dict[str, float]) -> None:
        """:meth:`add_round` with the round's read metrics: their ``client/local_acc_mean``, dropped from
        ``metrics`` when it is NaN (nobody of the round has a held-out split)."""
        local = metrics.get("client/local_acc_mean")
        if local is not None and math.isnan(local):
            metrics.pop("client/local_acc_mean")
            local = None
        self.add_round(clients, local)

    def add_evaluation(self, per_client: Tensor) -> float | None:
        """Record an evaluation: ``per_client`` ``[N]`` global-model accuracies (NaN: no held-out split)."""
        if self.last_cohort is None:
            return None
        mean = self._mean(per_client[self.last_cohort.to(per_client.device)])
        if mean is not None and (self.best_global is None or mean > self.best_global):
            self.best_global = mean
        return mean

    def summary(self) -> dict[str, float]:
        """``{"final/bmta_global": ..., "final/bmta_local": ...}`` for the values there are."""
        out = {}
        if self.best_global is not None:
            out["final/bmta_global"] = self.best_global
        if self.best_local is not None:
            out["final/bmta_local"] = self.best_local
        return out

    def state_dict(self) -> dict:
        return {"best_global": self.best_global, "best_local": self.best_local,
                "last_cohort": None if self.last_cohort is None else self.last_cohort.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.best_global, self.best_local = state["best_global"], state["best_local"]
        self.last_cohort = None if state["last_cohort"] is None else torch.tensor(state["last_cohort"], dtype=torch.long)
