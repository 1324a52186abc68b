"""Independent float64 references for the robust rules and attacks (Python lists and loops, not the package's tensor ops),
and a toy federated problem with enough clients for Krum and Bulyan."""

from __future__ import annotations

import math

import torch
from test_objectives import X, Y, squared_loss, toy_data
from torch import nn

from lfed.base.component import Cohort
from lfed.core import registry as algorithms
from lfed.core.algorithm import setup_state
from lfed.engine import CohortTrainer
from lfed.state.spec import ModuleStateStore

# seven clients over the nine toy examples (rows may repeat across clients)
ROWS = [[0, 1], [2, 3, 4], [5, 6, 7, 8], [1, 2], [3, 4, 5], [6, 7], [0, 8]]
W0 = torch.tensor([0.3, -0.2], dtype=torch.float64)


def cohort_of(k: int, counting=None, byzantine=None, round: int = 0, seed: int = 0) -> Cohort:
    """A hand-made cohort of ``k`` clients (ids 0..k-1), all counting unless ``counting`` says otherwise."""
    c = Cohort(round, torch.arange(k), torch.full((k,), 2), torch.ones(k, dtype=torch.long), torch.ones(k, dtype=torch.long),
               k, counting=torch.ones(k, dtype=torch.bool) if counting is None else torch.tensor(counting),
               expected_size=float(k), seed=seed)
    c.host_values()
    if byzantine is not None:
        c.byzantine = torch.tensor(byzantine)
        c.host.byzantine = c.byzantine.clone()
    return c


def rows(x):
    return [[float(v) for v in r] for r in x]


def sqdist(a, b):
    return sum((u - v) ** 2 for u, v in zip(a, b))


def ref_median(x):
    k, out = len(x), []
    for i in range(len(x[0])):
        col = sorted(r[i] for r in x)
        out.append((col[(k - 1) // 2] + col[k // 2]) / 2)
    return out


def ref_trimmed(x, f):
    out = []
    for i in range(len(x[0])):
        col = sorted(r[i] for r in x)[f:len(x) - f]
        out.append(sum(col) / len(col))
    return out


def ref_scores(x, f):
    k = len(x)
    out = []
    for i in range(k):
        d = sorted(sqdist(x[i], x[j]) for j in range(k) if j != i)
        out.append(sum(d[:max(k - f - 2, 0)]))
    return out


def ref_krum(x, f):
    s = ref_scores(x, f)
    return s.index(min(s))  # the first of equal minima


def ref_multi_krum(x, f, m):
    s = ref_scores(x, f)
    chosen = sorted(range(len(x)), key=lambda i: (s[i], i))[:m]
    return [sum(x[i][c] for i in chosen) / m for c in range(len(x[0]))], sorted(chosen)


def ref_bulyan(x, f):
    k = len(x)
    remaining, chosen = list(range(k)), []
    for _ in range(k - 2 * f):
        sub = [x[i] for i in remaining]
        pick = remaining[ref_krum(sub, f) if len(sub) - f - 2 > 0 else 0]
        chosen.append(pick)
        remaining.remove(pick)
    s = [x[i] for i in chosen]
    beta = k - 4 * f
    med = ref_median(s)
    out = []
    for c in range(len(x[0])):  # ties in |x - med|: the lower row of the cohort (not the order Krum picked the rows)
        order = sorted(range(len(s)), key=lambda i: (abs(s[i][c] - med[c]), chosen[i]))[:beta]
        out.append(sum(s[i][c] for i in order) / beta)
    return out, sorted(chosen)


def ref_geomed(x, a, iterations, nu):
    total = sum(a)
    alpha = [v / total for v in a]
    z = [sum(alpha[i] * x[i][c] for i in range(len(x))) for c in range(len(x[0]))]
    for _ in range(iterations):
        beta = [alpha[i] / max(nu, math.sqrt(sqdist(z, x[i]))) for i in range(len(x))]
        z = [sum(beta[i] * x[i][c] for i in range(len(x))) / sum(beta) for c in range(len(x[0]))]
    return z


def ref_cc(x, v, tau, iterations):
    for _ in range(iterations):
        step = [0.0] * len(v)
        for r in x:
            diff = [u - w for u, w in zip(r, v)]
            norm = math.sqrt(sum(d * d for d in diff))
            scale = 1.0 if norm == 0 else min(1.0, tau / norm)
            step = [s + scale * d / len(x) for s, d in zip(step, diff)]
        v = [w + s for w, s in zip(v, step)]
    return v


def ref_nnm_rows(x, f):
    k = len(x)
    out = []
    for i in range(k):  # itself always, then the k - f - 1 nearest others (ties: the lower row)
        near = [i] + sorted((j for j in range(k) if j != i), key=lambda j: (sqdist(x[i], x[j]), j))[:k - f - 1]
        out.append([sum(x[j][c] for j in near) / (k - f) for c in range(len(x[0]))])
    return out


def toy_setup(backend: str, rows=ROWS, **explicit):
    """``(algorithm, data, engine)`` of the toy problem with ``rows`` as clients and the ``explicit`` roles."""
    net = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        net.weight.copy_(W0[None])
    alg = algorithms.build(algorithms.resolve("fedavg", **explicit))
    data = toy_data(rows).build()
    setup_state(alg, ModuleStateStore(), data.client_sizes, 2, W0)
    return alg, data, CohortTrainer(net, squared_loss, backend)


def local_update(w, rows_k, steps, lr, labels=None):
    """Full-batch gradient descent on ``(w·x - y)²`` over the examples ``rows_k`` (``labels``: replaces ``Y``)."""
    x = X[rows_k]
    y = (Y[rows_k] if labels is None else labels[rows_k]).double()
    v = w.clone()
    for _ in range(steps):
        v = v - lr * 2 * x.T @ (x @ v - y) / len(rows_k)
    return v - w
