"""Simulated secure aggregation (Bonawitz et al., CCS 2017) as pure functions and a server combination (docs/privacy.md
"Secure aggregation (simulated)", docs/algorithms.md §17).

Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, *Practical Secure Aggregation for
Privacy-Preserving Machine Learning* (CCS 2017). The server learns ``Σ_{k∈U} x_k`` (mod ``M``) and nothing else about
the survivors' vectors ``x_k``; what is simulated here is the arithmetic, for real, not the cryptography:

* **Fixed point** (:func:`encode`, :func:`decode`): ``v = round(x · scale)`` by deterministic round-half-to-even (torch's
  ``round``; ``rounding="stochastic"``: ``⌊x·s⌋ + Bernoulli(x·s - ⌊x·s⌋)``, unbiased), mapped into ``Z_M``, ``M = 2^bits``, as
  two's complement (a negative ``v`` becomes ``M - |v|``), int64. :func:`decode` maps a residue back to the signed
  range ``[-M/2, M/2)`` and divides by ``scale``.
* **Pairwise masks** (§3 of the paper, "masking with one-time pads", eq. ``y_u = x_u + Σ_{v>u} s_{u,v} - Σ_{v<u} s_{v,u}
  (mod R)``): each pair ``u < v`` of the clients that take part in masking shares a mask ``s_{u,v}`` uniform in ``Z_M``,
  drawn from a generator seeded by the pair (the simulation of ``PRG(s_{u,v})``, the agreed key); ``u`` adds it, ``v``
  subtracts it (:func:`masked_uploads`). Each masked upload alone is uniform in ``Z_M``; the masks cancel in the sum.
* **Dropouts after masking** (§3, "handling dropped users", the ``s_{u,v}`` of a dropped ``u`` are reconstructed from the
  survivors' Shamir shares): :func:`modular_sum` sums the survivors' uploads and removes every pair mask that a survivor
  shares with a dropped client (regenerated from the pair's seed). The dropped clients' vectors are absent from the sum.
  The double masking (self masks ``b_u`` against a server that lies about dropouts) is not simulated: a simulated
  server is honest, and it changes no sum.
* **Overflow**: the decoded sum is right only if the signed sum fits in ``[-M/2, M/2)``. :func:`check_range` raises when
  it does not (every round of :class:`SecureAggregation`); :class:`SecureAggregation` refuses, before round 0,
  settings under which it could.

Error bound (deterministic rounding): each coordinate of each encoding is within ``1/(2·scale)`` of ``x``, so the
decoded sum of ``K`` vectors is within ``K/(2·scale)`` of the float sum, as long as that sum is in range.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lfed.base.declaration import Declaration, Releases, Supports, declaration
from lfed.checks import integer, number
from lfed.privacy.releases import SETTINGS, releases_of
from lfed.rng import round_generator
from lfed.server.combination import ServerCombination

__all__ = ["ROUNDINGS", "SecureAggregation", "check_range", "counting_rows", "decode", "encode", "masked_uploads",
           "modular_sum", "pair_mask", "survivors", "to_signed"]

ROUNDINGS = ("nearest", "stochastic")


def _modulus(bits: int) -> int:
    integer("bits", bits, at_least=2)
    if bits > 62:
        raise ValueError(f"bits: at most 62 (int64 residues and their sums of two), got {bits}")
    return 1 << bits


def encode(x: Tensor, scale: float, bits: int, rounding: str = "nearest", generator: torch.Generator | None = None) -> Tensor:
    """``round(x · scale) mod 2^bits`` as int64 in ``[0, M)`` (two's complement: ``-v`` becomes ``M - v``).

    ``rounding``: ``nearest`` (default: round half to even, deterministic) or ``stochastic``
    (``⌊x·s⌋ + Bernoulli(frac)``, from ``generator``). A value outside ``[-M/2, M/2)`` wraps (:func:`check_range`)."""
    M = _modulus(bits)
    number("scale", scale, above=0)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: {rounding!r} is not one of {ROUNDINGS}")
    y = x.double() * float(scale)
    if rounding == "nearest":
        v = torch.round(y)
    else:
        low = torch.floor(y)
        v = low + (torch.rand(y.shape, generator=generator, dtype=torch.float64) < (y - low)).double()
    return torch.remainder(v.long(), M)


def to_signed(s: Tensor, bits: int) -> Tensor:
    """A residue of ``Z_M`` as the integer of ``[-M/2, M/2)`` it stands for."""
    M = _modulus(bits)
    s = torch.remainder(s.long(), M)
    return torch.where(s >= M // 2, s - M, s)


def decode(s: Tensor, scale: float, bits: int) -> Tensor:
    """:func:`to_signed` ``(s) / scale`` (float64): the inverse of :func:`encode` on the signed range."""
    return to_signed(s, bits).double() / float(scale)


def pair_mask(a: int, b: int, P: int, bits: int, seed: int, round: int) -> Tensor:
    """``s_{a,b}`` uniform in ``Z_M`` (``[P]`` int64) of clients ``a < b`` in ``round``: the pair's shared pseudo-random
    mask, regenerated from the pair alone (what the survivors' key shares let the server do for a dropped client)."""
    g = round_generator(seed, round, f"secagg-pair/{a}/{b}")
    return torch.randint(0, _modulus(bits), (P,), generator=g, dtype=torch.long)


def masked_uploads(rows: Tensor, bits: int, ids: Tensor | list[int], seed: int, round: int) -> Tensor:
    """``y_u = x_u + Σ_{v>u} s_{u,v} - Σ_{v<u} s_{v,u} mod M`` for each row ``u`` of ``rows [K, P]`` (residues of
    ``Z_M``), clients ordered by their ids ``ids [K]`` (distinct): what the server receives from each."""
    M = _modulus(bits)
    K, P = rows.shape
    ids = [int(i) for i in ids]
    if len(set(ids)) != K:
        raise ValueError(f"ids: need {K} distinct client ids, got {ids}")
    out = torch.remainder(rows.long(), M).clone()
    for u in range(K):
        for v in range(u + 1, K):
            a, b = sorted((ids[u], ids[v]))
            s = pair_mask(a, b, P, bits, seed, round)
            lo, hi = (u, v) if ids[u] < ids[v] else (v, u)  # the client of the smaller id adds s, the other subtracts
            out[lo] = torch.remainder(out[lo] + s, M)
            out[hi] = torch.remainder(out[hi] - s, M)
    return out


def modular_sum(rows: Tensor, bits: int, survived: Tensor | None = None, *, ids: Tensor | list[int] | None = None,
                seed: int = 0, round: int = 0, masks: bool = True) -> Tensor:
    """``Σ_{k∈U} x_k mod M`` (``[P]`` int64) as the server computes it from the masked uploads.

    Every row of ``rows [K, P]`` is masked (:func:`masked_uploads`); ``survived [K]`` bool (None: all) says whose
    upload arrives. The server adds the arrived uploads and removes the pair masks that survivors share with the
    dropped clients (regenerated, :func:`pair_mask`): the dropped clients' rows are absent from the sum.
    ``masks=False``: the survivors' residues summed directly, without drawing the ``K(K-1)/2`` pair masks (``O(K² P)``
    draws): the same sum exactly, since the masks cancel in ``Z_M`` (tests/privacy/test_secagg.py checks both)."""
    M = _modulus(bits)
    K, P = rows.shape
    ids = list(range(K)) if ids is None else [int(i) for i in ids]
    survived = torch.ones(K, dtype=torch.bool) if survived is None else survived.bool().cpu()
    if not masks:
        kept = torch.remainder(rows.long(), M)[survived]
        return torch.remainder(kept.sum(0), M) if kept.shape[0] else torch.zeros(P, dtype=torch.long)
    uploads = masked_uploads(rows, bits, ids, seed, round)
    total = torch.remainder(uploads[survived].sum(0), M) if bool(survived.any()) else torch.zeros(P, dtype=torch.long)
    for d in (~survived).nonzero().flatten().tolist():  # recovery: a dropped client's pair masks with the survivors
        for u in survived.nonzero().flatten().tolist():
            a, b = sorted((ids[d], ids[u]))
            s = pair_mask(a, b, P, bits, seed, round)
            # survivor u added s if its id is the smaller of the pair, else subtracted it: take it out
            total = torch.remainder(total - s if ids[u] < ids[d] else total + s, M)
    return total


def check_range(signed: Tensor, bits: int, scale: float) -> float:
    """The largest ``|Σ_k v_k|`` over the coordinates of the signed encodings ``signed [K, P]``, as a fraction of
    ``M/2``; raise ``ValueError`` (naming ``bits`` and ``scale``) when the sum leaves ``[-M/2, M/2)`` (a wrap: the
    decoded sum would be wrong, not merely imprecise). Summed in float64: exact below 2^53, and far from it only
    beyond the range."""
    M = _modulus(bits)
    total = signed.double().sum(0)
    worst = float(total.abs().max()) if total.numel() else 0.0
    if total.numel() and (float(total.max()) >= M / 2 or float(total.min()) < -M / 2):
        raise ValueError(f"bits: the round's sum reaches |{worst:.6g}| in fixed point, outside the signed range of "
                         f"bits = {bits} (±{M // 2}); the modular sum would wrap. Give more bits or a smaller scale "
                         f"(scale = {scale:g})")
    return worst / (M / 2)


class SecureAggregation(ServerCombination):
    """The weighted mean of the cohort's updates through simulated secure aggregation (module docstring).

    Each counting client clips its update coordinate-wise to ``[-clip, clip]`` (L-infinity: it bounds every
    coordinate, which is what the fixed-point range needs), multiplies it by its public weight ``a_k`` (uniform
    ``1/|S|``, or ``n_k / Σ_S n_j`` with the clients' sizes public to the server, as lfed's server holds them), encodes
    it (:func:`encode`) and uploads it masked (:func:`masked_uploads`). After masking each client drops out with
    probability ``dropout`` (a seeded stream); the server's :func:`modular_sum` recovers the survivors' sum, and, the
    weights being public, it rescales it to the survivors' weighted mean ``Σ_U a_k x_k / Σ_U a_k``. Only the sum
    leaves the protocol.

    Args:
        bits: ``M = 2^bits`` (2..62, default 32).
        clip: The L-infinity clip ``c > 0`` of every coordinate (default 1.0).
        scale: The fixed-point scale; None (default): the largest power of two with
            ``c·scale + K_max/2 < M/2`` (the weighted sum of ``K_max`` encodings, weights summing to 1, each rounded by
            at most 1/2), from the run's largest cohort ``K_max``.
        dropout: Probability in [0, 1) that a client drops after masking (default 0).
        rounding: ``nearest`` (default, deterministic round half to even) or ``stochastic``.
        masks: True (default): every pair's mask is drawn and cancelled as the protocol would (``O(K² P)`` draws a
            round); False: the survivors' residues are summed directly, the same sum exactly, for large cohorts.
        log_unaccounted: False (default): the run logs only what the sum and the server's own data give (the metric
            gate, :mod:`lfed.base.metric_gate`: the clients' training losses, their own accuracies, the realised
            cohort are per-client values the server would not see); True: those too, marked ``unaccounted/``.
    """

    name = "secagg"

    def __init__(self, bits: int = 32, clip: float = 1.0, scale: float | None = None, dropout: float = 0.0,
                 rounding: str = "nearest", masks: bool = True, log_unaccounted: bool = False) -> None:
        super().__init__()
        for name, value in (("masks", masks), ("log_unaccounted", log_unaccounted)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: must be true or false, got {value!r}")
        self.masks, self.log_unaccounted = masks, log_unaccounted
        self.M = _modulus(bits)
        self.bits = bits
        self.clip = number("clip", clip, above=0)
        if scale is not None:
            number("scale", scale, above=0)
        self.scale = None if scale is None else float(scale)
        self._given_scale = self.scale
        self.dropout = number("dropout", dropout, at_least=0, below=1)
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding: {rounding!r} is not one of {ROUNDINGS}")
        self.rounding = rounding
        self._report: dict[str, float] = {}

    def hparams(self) -> dict:
        return {"bits": self.bits, "clip": self.clip, "scale": self._given_scale, "dropout": self.dropout,
                "rounding": self.rounding, "masks": self.masks, "log_unaccounted": self.log_unaccounted}

    @property
    def declares(self) -> Declaration:  # type: ignore[override]
        """Per-client metrics are what secure aggregation hides: ``drop`` (or ``mark`` with ``log_unaccounted``); what
        :meth:`report` computes from the sum alone is private. Not defined asynchronously."""
        return Declaration(releases=Releases(private_metrics=("secagg/dropped", "secagg/max_abs_fraction_of_range"),
                                             metric_policy="mark" if self.log_unaccounted else "drop"),
                           supports=Supports(asynchronous="masks one synchronous cohort's uploads; use a synchronous schedule"))

    # ------------------------------------------------------------------ before round 0
    def check(self, context) -> list[str]:
        """Refuse what would show the server more than the sum; fix the scale; refuse settings that can overflow."""
        refuse_beside_the_sum(context, "secure aggregation")
        sizes = context.cohort_sizes or []
        if sizes:
            self.fix_scale(max(sizes))
        return []

    def fix_scale(self, k_max: int) -> None:
        """The scale for cohorts of up to ``k_max`` clients (the setting, or derived); refuse one that can overflow."""
        half = self.M / 2
        if self._given_scale is None:
            room = half - k_max / 2 - 1
            if room <= 0:
                raise ValueError(f"bits: {self.bits} bits (±{int(half)}) cannot hold the rounding of {k_max} clients "
                                 "(K/2); give more bits")
            self.scale = 2.0 ** math.floor(math.log2(room / self.clip))
        if self.clip * self.scale + k_max / 2 >= half:
            raise ValueError(f"bits: {k_max} clients' weighted sum of clip·scale = {self.clip:g}·{self.scale:g} "
                             f"(+ K/2 rounding) can reach ±{self.clip * self.scale + k_max / 2:.6g}, outside the range "
                             f"of bits = {self.bits} (±{int(half)}); give more bits or a smaller scale")

    # ------------------------------------------------------------------ one round
    def combine(self, updates, weights, cohort):
        K, P = updates.shape
        host = cohort.host_values()
        counting, idx = counting_rows(cohort, K)
        if self.scale is None:
            self.fix_scale(len(idx))
        a = (torch.full((K,), 1.0 / max(len(idx), 1), dtype=torch.float64) if weights is None
             else weights.detach().double().cpu())
        a = torch.where(counting, a, torch.zeros((), dtype=torch.float64))
        x = updates.detach().double().cpu()[idx].clamp(-self.clip, self.clip) * a[idx, None]
        g = round_generator(cohort.seed, cohort.round, "secagg-rounding")
        rows = encode(x, self.scale, self.bits, self.rounding, g)
        signed = to_signed(rows, self.bits)
        survived = self.survivors(len(idx), cohort)
        fraction = check_range(signed[survived], self.bits, self.scale)
        total = modular_sum(rows, self.bits, survived, ids=host.clients[idx], seed=cohort.seed, round=cohort.round,
                            masks=self.masks)
        kept = float(a[idx][survived].sum())
        planned = float(a[idx].sum())
        delta = decode(total, self.scale, self.bits) * (planned / kept if kept > 0 else 0.0)
        self._report = {"secagg/dropped": float((~survived).sum()), "secagg/max_abs_fraction_of_range": fraction}
        return delta.to(updates.device, updates.dtype), None

    def survivors(self, K: int, cohort) -> Tensor:
        """``[K]`` bool: who does not drop after masking (:func:`survivors`, stream ``secagg-dropout``)."""
        return survivors(K, self.dropout, cohort, "secagg-dropout")

    def report(self, cohort) -> dict[str, float]:
        return dict(self._report)


def counting_rows(cohort, K: int) -> tuple[Tensor, Tensor]:
    """``([K] bool, their indices)``: the rows whose work counts (the cohort's host mask; all without one)."""
    host = cohort.host_values()
    counting = host.counting.bool() if host.counting is not None else torch.ones(K, dtype=torch.bool)
    return counting, counting.nonzero().flatten()


def survivors(K: int, dropout: float, cohort, stream: str) -> Tensor:
    """``[K]`` bool: who does not drop after masking, each independently with probability ``dropout`` (drawn from the
    round's ``stream``, apart from the data)."""
    if dropout == 0:
        return torch.ones(K, dtype=torch.bool)
    g = round_generator(cohort.seed, cohort.round, stream)
    return torch.rand(K, generator=g, dtype=torch.float64) >= dropout


def refuse_beside_the_sum(context, what: str) -> None:
    """Raise ``ValueError`` (one line, naming the setting) for a component that shows the server more than the
    cohort's sum: a declared release (:mod:`lfed.privacy.releases`: per-client selection or weights read from the
    clients' data: robust rules, IGFL-S attention, DWFed, AdaFL's sampler, SCAFFOLD's control variates, ...), a
    component reading each client's previous update or its start loss, or a lossy channel (the server would see each
    client's compressed update)."""
    roles = context.components or {}
    for role, component in roles.items():
        if role == "combination":
            continue
        setting = SETTINGS.get(role, role)
        for release in releases_of(component):
            raise ValueError(f"{setting}: {release}, which {what} would show the server beside the sum; use a "
                             f"{setting} that sends nothing but its update with {what}")
        needs = declaration(component).needs
        if needs.history or needs.start_loss:
            raise ValueError(f"{setting}: {getattr(component, 'name', component)!r} reads each client's own previous "
                             f"update or start loss on the server, which {what} hides (only the sum leaves); use "
                             f"another {setting} with {what}")
    channel = roles.get("channel")
    if channel is not None and not declaration(channel).supports.exact:
        raise ValueError(f"channel: a lossy channel shows the server each client's compressed update, and {what} "
                         "sums dense fixed-point vectors; use channel: false")
    for release in context.net_releases:
        raise ValueError(f"net: {release}, which {what} would show the server beside the sum; use a net without "
                         "running statistics")
