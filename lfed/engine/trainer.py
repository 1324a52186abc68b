"""CohortTrainer: the entry point of local training of a cohort, and the choice of its backend.

:class:`CohortTrainer` checks its inputs, draws the batch schedule (:mod:`lfed.engine.batches`),
splits the cohort into chunks and hands each chunk to a backend: ``vmap``
(:mod:`lfed.engine.vmap`) or ``loop`` (:mod:`lfed.engine.loop`), resolved from ``"auto"`` by a
probe step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import grad_and_value, vmap

from lfed.engine.batches import batch_schedule
from lfed.engine.example_dp import expected_batch_check, poisson_schedule
from lfed.engine.host import to_device
from lfed.engine.loop import LoopBackend
from lfed.engine.losses import LossFn, as_per_example_loss
from lfed.engine.norm import flat_batch_norms, has_batch_norm, running_stat_names
from lfed.engine.params import ParamLayout
from lfed.engine.recorded import _rng_state, _set_rng_state
from lfed.engine.result import CohortResult
from lfed.engine.rule import StepRule
from lfed.engine.vmap import VmapBackend

BACKENDS = ("auto", "vmap", "loop")

#: On a CPU, the automatic chunk keeps the tensors autograd saves for the chunk's step within this
#: many bytes (``chunk x`` one client's saved bytes; BENCHMARKS.md, "LoRA adapters").
CPU_ACTIVATION_BUDGET = 1 << 27
#: On a GPU, the same bound is this share of the device's total memory (total, not free: the chunk,
#: and with it a dropout model's draws, must not depend on what else happens to be allocated).
GPU_ACTIVATION_SHARE = 1 / 16


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@contextlib.contextmanager
def _hooks_silenced(net: nn.Module) -> Iterator[None]:
    """No module hook (the net's, its submodules' or global) fires inside; all are back after.

    The dictionaries are emptied and refilled in place (same objects, same order), so the hooks'
    handles keep working.
    """
    from torch.nn.modules import module as m

    dicts = [getattr(m, f"_global{name}") for name in _HOOK_DICTS if hasattr(m, f"_global{name}")]
    dicts += [d for mod in net.modules() for name in _HOOK_DICTS if (d := getattr(mod, name, None))]
    saved = [dict(d) for d in dicts]
    for d in dicts:
        d.clear()
    try:
        yield
    finally:
        for d, items in zip(dicts, saved):
            d.update(items)


def _storage_key(t: Tensor) -> tuple[int, int]:
    """``(data pointer, bytes)`` of the storage behind ``t`` (its own size for a tensor without one)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # a tensor without a plain storage
        return id(t), t.numel() * t.element_size()


def _uniform_lr(lr: float | Tensor) -> float | Tensor:
    """A per-row learning rate whose rows all agree, as the float itself (the single-run path)."""
    if isinstance(lr, Tensor) and lr.numel() > 0:  # a host tensor (the engine keeps lr on the CPU)
        rates = lr.tolist()
        if all(r == rates[0] for r in rates):
            return float(rates[0])
    return lr


class CohortTrainer(VmapBackend, LoopBackend):
    """Runs the local training of a cohort of clients (docs/algorithms.md §1, §2) on one device.

    Args:
        net: The model; only its structure and buffers are used, parameters come in flat.
        loss: Per-example loss (see :func:`as_per_example_loss`); cross-entropy by default.
        backend: ``"vmap"``, ``"loop"`` or ``"auto"`` (vmap unless the model cannot be vmapped). Both train
            BatchNorm with running statistics, each client updating its own (:mod:`lfed.engine.norm`).
        chunk_size: Train at most this many clients at once (bounds memory); None chooses: the
            vmap backend trains chunks whose activations (what autograd saves for the chunk's
            step, measured for one client) stay within :meth:`activation_budget` and, on a CPU,
            whose ``[chunk, P]`` weights stay within 16 MB (see :meth:`_auto_chunk`); the loop
            backend the whole cohort. Chunking never changes the result, only speed and memory.
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
        self._vmapped_term_no_aux = vmap(grad_and_value(self._client_loss_with_term),  # a term with aux=None
                                         in_dims=(0, 0, 0, 0, None, None, None), randomness="different")
        # a net with BatchNorm (lfed.engine.norm): every row its own buffers (in_dims 0), the updated running
        # statistics returned beside the loss (has_aux), the batch statistics over the valid examples only
        self.batch_norm = has_batch_norm(net)
        self._flat: list[str] | None = None  # its BatchNorm layers without spatial extent (found on first need)
        self._vmapped_stats = vmap(grad_and_value(self._client_loss_stats, has_aux=True), in_dims=(0, 0, 0, 0, 0),
                                   randomness="different")
        self._vmapped_term_stats = vmap(grad_and_value(self._client_loss_with_term_stats, has_aux=True),
                                        in_dims=(0, 0, 0, 0, 0, None, 0), randomness="different")
        self._vmapped_term_no_aux_stats = vmap(grad_and_value(self._client_loss_with_term_stats, has_aux=True),
                                               in_dims=(0, 0, 0, 0, 0, None, None), randomness="different")
        # example-level DP-SGD (lfed.engine.example_dp): per client, the clipped sum of its per-example gradients
        self._vmapped_dp = vmap(self._client_dp_grad, in_dims=(0, 0, 0, 0, None, None), randomness="different")
        self._work: nn.Module | None = None  # the loop backend's private copy of ``net``
        self.trace = bool(trace)
        self._traced: dict[tuple, Callable] = {}  # recorded vmap steps by shapes, dtypes, device, mode
        self._saved: dict[tuple, int | None] = {}  # one client's saved-tensor bytes by shapes, dtypes, device, mode

    # ----------------------------------------------------------------- backend choice
    @property
    def backend(self) -> str:
        """The backend in use (``auto`` is resolved on the first round)."""
        return self._backend or "undecided"

    def _refuse_batches_of_one(self, valid: Tensor, steps: Tensor, data_x: Tensor, index: Tensor,
                               rows: Tensor | None) -> None:
        """Raise where a trained step has one valid example and a BatchNorm layer has no spatial extent: torch (the loop
        backend) raises "Expected more than 1 value per channel when training", and the vmap backend would write
        ``running_var = NaN`` (its unbiased variance divides by ``n - 1``). A run refuses such settings before round 0
        (:func:`lfed.engine.norm.check_batches_of_one`); this is the engine's own guard, from the host schedule."""
        v = valid.detach().cpu() if valid.device.type != "cpu" else valid
        if v.dim() != 3 or v.shape[1] == 0:
            return
        taken = torch.arange(v.shape[1])[None, :] < steps[:, None]
        if rows is not None:
            keep = torch.zeros(v.shape[0], dtype=torch.bool)
            keep[rows.detach().cpu().long()] = True
            taken = taken & keep[:, None]
        ones = (v.sum(-1) == 1) & taken
        if not bool(ones.any()):
            return
        if self._flat is None:
            first = index.detach().reshape(-1)[:2].to(data_x.device)
            self._flat = flat_batch_norms(self.net, data_x[first])
        if self._flat:
            k, t = (int(i) for i in ones.nonzero()[0])
            raise ValueError(f"batch_size: row {k}'s step {t} has a batch of one example, and BatchNorm layer "
                             f"{self._flat[0]!r} has no spatial extent, so it cannot normalise it (torch: 'Expected more "
                             "than 1 value per channel when training'); choose a batch_size that leaves no client a batch "
                             "of one, or a norm without batch statistics (GroupNorm, LayerNorm)")

    def resolve_backend(self, x: Tensor, y: Tensor) -> str:
        """Pick the backend for ``auto``: vmap if a two-client probe step works, else loop."""
        if self._backend is not None:
            return self._backend
        try:
            w = self.layout.module_vector(self.net).to(x.device)
            W = torch.stack([w, w])
            n = 2 if self.batch_norm else 1  # BatchNorm of one example (no spatial size) is an error in training
            xs, ys = x[:n].expand(2, n, *x.shape[1:]), y[:n].expand(2, n, *y.shape[1:])
            mask = torch.ones(2, n, dtype=w.dtype, device=w.device)
            if self.batch_norm:
                self._vmapped_stats(self.layout.unflatten(W), xs, ys, mask, self._row_buffers(2))
            else:
                self._vmapped(self.layout.unflatten(W), xs, ys, mask, self._buffers())
            self._backend = "vmap"
        except Exception:  # any vmap limitation (custom kernels, in-place buffer updates, cuDNN RNN)
            self._backend = "loop"
        return self._backend

    # ----------------------------------------------------------------- buffers
    def _buffers(self) -> dict[str, Tensor]:
        return dict(self.net.named_buffers())

    def _row_buffers(self, K: int, start: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``{name: [K, *shape]}`` every buffer of the net per row: ``start``'s rows where given, else the net's
        (a copy for the running statistics, which the rows update; an expanded view for the rest)."""
        stats = set(running_stat_names(self.net))
        out = {}
        for name, b in self._buffers().items():
            if start is not None and name in start:
                out[name] = start[name].to(b.device).clone()
            elif name in stats:
                out[name] = b.expand(K, *b.shape).clone()
            else:
                out[name] = b.expand(K, *b.shape)
        return out

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
        buffers: dict[str, Tensor] | None = None,
        augment: tuple | None = None,
    ) -> CohortResult:
        """Local training of K clients from the broadcast weights ``w_start``.

        The rows need not belong to one run: :mod:`lfed.core.lockstep` trains the cohorts of several
        runs in one call, each row with its own start weights (``w_start [K, P]``), learning
        rate (``lr [K]``) and batches (``schedule``), and their rules concatenated
        (:func:`lfed.core.lockstep.concat_rules`). Each row's result is the one it gets trained alone.

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
                would beside the others (:mod:`lfed.engine.ranks` splits a cohort over ranks so).
            schedule: ``(positions [K, T, B'], valid [K, T, B'])``, the batches of every row
                (:func:`batch_schedule`, ``T >= max(steps_done)``); None: drawn from ``generator``.
            buffers: ``{name: [K, *shape]}`` each row's own start values of some of the net's buffers
                (FedBN's per-client running statistics); None: every row starts from the net's buffers.
            augment: ``(augmentation, source)``: every step's batch transformed by an
                :class:`lfed.data.augment.Augmentation` with its examples' parameters, ``source`` the
                generator to draw them from for the whole ``[K, T, B']`` schedule, or the parameters
                already drawn (a grid's rows, :mod:`lfed.core.lockstep`); None: the data as it is.

        Returns:
            The result of the trained rows, in the order of ``rows``.
        """
        K = index.shape[0]
        if K == 0 and rows is None:  # an empty cohort (Poisson sampling may draw nobody): nothing to train
            return CohortResult(w_start.new_zeros(0, self.layout.num_params), w_start.new_zeros(0), None)
        steps = steps_done.detach().cpu().long()
        lr = self._checked_rows(w_start, lr, buffers, K)
        if rule.example_dp is not None:
            self._check_example_dp(rule, batch_size, schedule)
        positions, valid, rule = self._batches(schedule, generator, rule, num_examples, steps, batch_size, K)
        if self.batch_norm:  # a step of one example at a BatchNorm without spatial extent: refused on both backends
            self._refuse_batches_of_one(valid, steps, data_x, index, rows)
        positions, valid = to_device(positions, index.device), to_device(valid, index.device)  # drawn on the host
        if augment is not None:  # the parameters of every (row, step, example), drawn once for all rows and chunks
            aug, source = augment
            params = source if isinstance(source, dict) else aug.draw(tuple(positions.shape), tuple(data_x.shape[1:]), source)
            augment = (aug, {k: to_device(v, index.device) for k, v in params.items()})
        backend = self.resolve_backend(data_x, data_y)
        selected = torch.arange(K) if rows is None else rows.detach().cpu().long()
        if selected.numel() == 0:
            raise ValueError("rows: no rows to train; give at least one row of the cohort, or None for all")
        size = self.chunk_size
        if size is None:
            size = self._chunk_for(selected, backend, rule, w_start, data_x, data_y, index, positions, valid)
        run = self._train_vmap if backend == "vmap" else self._train_loop
        return self._train_chunks(run, selected, size, rows, K, w_start, data_x, data_y, index, positions, valid, steps, rule, lr,
                                  buffers, augment)

    def _checked_rows(self, w_start: Tensor, lr: float | Tensor, buffers: dict[str, Tensor] | None, K: int) -> float | Tensor:
        """Refuse per-row inputs (start weights, learning rates, buffers) of another number of rows than ``K``; the
        learning rate as :meth:`train` uses it (a per-row one as float64 on the CPU)."""
        if w_start.dim() == 2 and w_start.shape[0] != K:
            raise ValueError(f"w_start: {w_start.shape[0]} rows of start weights for a cohort of {K} clients")
        if isinstance(lr, Tensor):
            if lr.shape != (K,):
                raise ValueError(f"lr: a per-row learning rate must be [K] = [{K}], got shape {tuple(lr.shape)}")
            lr = lr.detach().cpu().double()
        if buffers is not None:
            own = self._buffers()
            for name, b in buffers.items():
                if name not in own or tuple(b.shape) != (K, *own[name].shape):
                    raise ValueError(f"buffers: {name!r} must be a buffer of the net given as [K={K}, *shape], got "
                                     f"{tuple(b.shape)}")
        return lr

    def _batches(self, schedule: tuple[Tensor, Tensor] | None, generator: torch.Generator | None, rule: StepRule,
                 num_examples: Tensor, steps: Tensor, batch_size: int | None, K: int) -> tuple[Tensor, Tensor, StepRule]:
        """``(positions, valid, rule)``: the batches of every row, ``schedule`` checked or drawn from ``generator``
        (DP-SGD: Poisson batches from its own source, their realised sizes kept in the rule's ``example_dp``)."""
        if schedule is None:
            if generator is None:
                raise ValueError("generator: needed to draw the batch schedule (or give schedule=(positions, valid))")
            draw = poisson_schedule if rule.example_dp is not None else batch_schedule  # DP-SGD: Poisson batches
            if rule.example_dp is not None and rule.example_dp.batches is not None:
                generator = rule.example_dp.batches  # DP-SGD's own (secure) source of its Poisson samples
            positions, valid = draw(num_examples, max(steps.tolist(), default=0), batch_size, generator)
            if rule.example_dp is not None:  # every row's realised batch sizes, kept on the host (the vmap backend's widths)
                rule = replace(rule, example_dp=replace(rule.example_dp, counts=valid.sum(-1)))
        else:
            positions, valid = schedule
            if positions.shape[0] != K or positions.shape != valid.shape or positions.shape[1] < max(steps.tolist(), default=0):
                raise ValueError(f"schedule: positions/valid must be [K={K}, T >= max steps, B'], got "
                                 f"{tuple(positions.shape)} and {tuple(valid.shape)}")
        return positions, valid, rule

    def _chunk_for(self, selected: Tensor, backend: str, rule: StepRule, w_start: Tensor, data_x: Tensor, data_y: Tensor,
                   index: Tensor, positions: Tensor, valid: Tensor) -> int:
        """The automatic chunk (``chunk_size=None``): rows trained per backend call, within the activation budget."""
        size = self._auto_chunk(selected.numel(), backend, w_start.device)
        if size > 1 and backend == "vmap" and positions.dim() == 3 and positions.shape[1] > 0:  # activations too
            saved = self._saved_bytes(w_start, data_x, data_y, index, positions, valid, selected[0].tolist())
            if rule.example_dp is not None:  # DP-SGD also holds every example's gradient: [B', P] per client
                saved = (saved or 0) + positions.shape[2] * self.layout.num_params * w_start.element_size()
            size = self._auto_chunk(selected.numel(), backend, w_start.device, saved)
            if rule.example_dp is not None and w_start.device.type == "cpu":
                # on a CPU the chunk's per-example gradients [chunk, B', P] stay within the cache-sized 2^22 numbers
                # of the weights' rule (_auto_chunk): written, then read for the norms and the clipped sum
                # (BENCHMARKS.md, "DP-SGD in the cohort")
                size = min(size, max(1, (1 << 22) // max(positions.shape[2] * self.layout.num_params, 1)))
        return size

    def _train_chunks(self, run: Callable[..., CohortResult], selected: Tensor, size: int, rows: Tensor | None, K: int,
                      w_start: Tensor, data_x: Tensor, data_y: Tensor, index: Tensor, positions: Tensor, valid: Tensor,
                      steps: Tensor, rule: StepRule, lr: float | Tensor, buffers: dict[str, Tensor] | None,
                      augment: tuple | None) -> CohortResult:
        """Each chunk of ``size`` of the ``selected`` rows through the backend ``run``; their results in row order."""
        results = []
        for lo in range(0, selected.numel(), size):
            part = selected[lo : lo + size]
            at = to_device(part, index.device)
            whole = rows is None and part.numel() == K
            sub_rule = rule if whole else rule.select(at, K)
            w0 = w_start if w_start.dim() == 1 or whole else w_start[to_device(part, w_start.device)]
            lr_part = _uniform_lr(lr if whole or not isinstance(lr, Tensor) else lr[part])
            args = (w0, data_x, data_y, index[at], positions[at], valid[at], steps[part], sub_rule, lr_part)
            extra = {}
            if buffers is not None:
                extra["buffers"] = {n: b if whole else b[part.to(b.device)] for n, b in buffers.items()}
            if augment is not None:
                extra["augment"] = (augment[0], {k: v if whole else v[at] for k, v in augment[1].items()})
            results.append(run(*args, **extra))
        if len(results) == 1:
            return results[0]
        buffers = None
        if results[0].buffers is not None:
            buffers = {k: torch.cat([r.buffers[k] for r in results]) for k in results[0].buffers}
        return CohortResult(torch.cat([r.weights for r in results]), torch.cat([r.loss for r in results]), buffers)

    def _check_example_dp(self, rule: StepRule, batch_size: int | None, schedule) -> None:
        """Refuse what example-level DP-SGD cannot be combined with (one line each)."""
        expected_batch_check(batch_size)
        if rule.loss_term is not None:
            raise ValueError("objective: a loss term (MOON, Ditto, FedRoD, ...) would be clipped per example with the "
                             "loss; example-level DP-SGD takes a step rule without a loss term")
        if self.batch_norm:
            raise ValueError("net: BatchNorm mixes the examples of a batch, so a per-example gradient (and its clip) is "
                             "not defined; use GroupNorm or LayerNorm with example-level DP-SGD (as Opacus requires)")
        if schedule is not None:
            raise ValueError("schedule: example-level DP-SGD draws its own Poisson batches; give schedule=None")

    def _auto_chunk(self, K: int, backend: str, device: torch.device, saved_bytes: int | None = None) -> int:
        """Clients per chunk when ``chunk_size`` is None.

        The vmap backend trains a chunk's clients as one computation, so its memory grows with the
        chunk in two ways, and the chunk bounds both:

        * **weights** (CPU only): ``max(1, 2**22 // P)`` clients at a time, so the chunk's weights and
          gradients (``[chunk, P]`` each, 16 MB in float32) stay in the cache between steps: a cohort of
          100 MLP 2NN clients trains about 1.4x faster in chunks of 21 than all at once
          (benchmarks/engine_throughput.py);
        * **activations** (any device): ``saved_bytes``, what autograd saves for one client's step
          (:meth:`_saved_bytes`), times the chunk stays within :meth:`activation_budget`. With a small
          ``P`` (adapters on a frozen base) this is the bound that matters: 50 clients of a LoRA
          transformer at once held 10 GB (BENCHMARKS.md, "LoRA adapters").

        The loop backend trains one client at a time anyway: the whole cohort. Chunking never changes
        a result (the chunks' rows are computed exactly as the whole cohort's), only speed and memory;
        a model with dropout draws its masks per vmap call, so its draws depend on the chunks, as
        they do on ``chunk_size`` (statistically the same run).
        """
        if backend != "vmap":
            return max(K, 1)
        size = K
        if device.type == "cpu":
            size = min(size, (1 << 22) // max(self.layout.num_params, 1))
        if saved_bytes:
            size = min(size, self.activation_budget(device) // saved_bytes)
        return max(1, size)

    def activation_budget(self, device: torch.device) -> int:
        """Bytes that the tensors autograd saves for one chunk's step may take on ``device``.

        ``CPU_ACTIVATION_BUDGET`` (128 MB) on a CPU (and any device other than CUDA); on a CUDA
        device ``GPU_ACTIVATION_SHARE`` (1/16) of its *total* memory, so the chunk is a function of
        the model, the shapes and the device alone, the same in every run. A step's peak is a few
        times its saved bytes (the gradients and temporaries of the backward; recording the step
        once per shape holds more): BENCHMARKS.md, "LoRA adapters".
        """
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory * GPU_ACTIVATION_SHARE)
        return CPU_ACTIVATION_BUDGET

    def _saved_bytes(self, w_start: Tensor, data_x: Tensor, data_y: Tensor, index: Tensor, positions: Tensor,
                     valid: Tensor, row: int) -> int | None:
        """Bytes of the tensors autograd saves for ONE client's local step (its forward and loss).

        Measured once per (input shape, batch width, dtypes, device, train/eval mode) with
        ``torch.autograd.graph.saved_tensors_hooks`` over one ordinary forward and loss of client
        ``row``'s first batch, counting each distinct storage once and leaving out the net's own
        parameters and buffers (a frozen base is read once by the whole chunk, not per client) and
        the client's weights (bounded by the ``[chunk, P]`` rule). A model's saved tensors are what
        its backward needs, so this is the per-client memory of a vmapped step up to a small factor,
        for any model. The measurement leaves no trace: the global RNG is restored (dropout draws
        nothing from the run's stream), no module hook fires, and nothing is kept. None when the
        forward cannot run outside vmap (then only the other rules choose the chunk).
        """
        ex = index[row].gather(0, positions[row, 0])  # the client's first batch (global example ids)
        x, y = data_x[ex], data_y[ex]
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, w_start.dtype, x.device, self.net.training)
        if key in self._saved:
            return self._saved[key]
        w = (w_start if w_start.dim() == 1 else w_start[row]).detach()
        exclude = {_storage_key(t)[0] for t in [*self.net.parameters(), *self.net.buffers()]}
        seen: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            ptr, nbytes = _storage_key(t)
            if ptr not in exclude:
                seen[ptr] = nbytes
            return t

        rng = _rng_state(x.device)
        try:
            params = {k: v.clone().requires_grad_(True) for k, v in self.layout.unflatten(w).items()}
            exclude.update(_storage_key(v)[0] for v in params.values())
            mask = valid[row, 0].to(w.dtype)
            with _hooks_silenced(self.net), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                if self.batch_norm:  # functional BatchNorm: the net's running statistics stay as they are
                    self._client_loss_stats(params, x, y, mask, self._buffers())
                else:
                    self._client_loss(params, x, y, mask, self._buffers())
            saved = sum(seen.values()) or None
        except Exception:  # noqa: BLE001 - a model that only runs under vmap (or in inference mode): no measurement
            saved = None
        finally:
            _set_rng_state(rng, x.device)
        if len(self._saved) >= 16:
            self._saved.pop(next(iter(self._saved)))
        self._saved[key] = saved
        return saved
