"""Issue 39, FEMNIST anomaly: Ditto's personal models traced participation by participation.

Trains Ditto on the study's setting (configs/paper/personal/femnist.yaml, λ = 0.1) and records, for every
participation of every writer: the round, the global model w^r it received, its personal model v_k before
and after, and checks the update by hand in float64 (v ← v − η(∇F_k(v) + λ(v − w^r)) on lfed's own
"personal" batches), then the held-out accuracy and the training loss of v_k and of w^r.

    PYTHONPATH=. python benchmarks/studies/femnist_probe/probe_ditto.py --rounds 160 --lr 0.03
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from conftest import run_rounds  # noqa: E402

from lfed.engine import batch_schedule  # noqa: E402
from lfed.lightning.datamodule import FederatedDataModule  # noqa: E402
from lfed.lightning.module import FederatedModule  # noqa: E402
from lfed.models.zoo import MLP  # noqa: E402
from lfed.personal.ditto import Ditto  # noqa: E402
from lfed.rng import round_generator  # noqa: E402

NET64 = MLP(784, [200, 200], 62, norm="layer").double()


def unflat(w):
    out, at = {}, 0
    for n, t in NET64.named_parameters():
        out[n] = w[at : at + t.numel()].view_as(t)
        at += t.numel()
    return out


def logits(w, x):
    return functional_call(NET64, unflat(w), (x,))


class ProbeDitto(Ditto):
    """Ditto with a record of every participation (and a by-hand check of its personal steps)."""

    def __init__(self, lam, data_ref, check_rounds):
        super().__init__(lam)
        self.data_ref, self.check_rounds = data_ref, check_rounds
        self.log = []
        self.max_err = 0.0

    def after_local(self, cohort, w_start, w_end, lr, local) -> None:
        clients = cohort.clients
        started = self._the_store().rows(self, "personal_started", clients).cpu().clone()
        v_before = self.rows("personal", clients, first=w_start).detach().double().cpu().clone()
        super().after_local(cohort, w_start, w_end, lr, local)
        v_after = self.rows("personal", clients, first=w_start).detach().double().cpu()
        w_r = w_start.detach().double().cpu()
        d = self.data_ref[0]
        r = int(local.round)
        steps = local.steps_done.cpu()
        check = r in self.check_rounds
        if check:
            pos, valid = batch_schedule(local.num_examples.cpu(), int(steps.max()), local.batch_size,
                                        round_generator(local.seed, r, "personal"))
        for i, k in enumerate(clients.cpu().tolist()):
            if not bool(cohort.active[i]):
                continue
            n, h = int(d.client_sizes[k]), int(d.holdout_sizes[k])
            xt, yt = d.train_x[d.client_index[k, :n]].double().flatten(1), d.train_y[d.client_index[k, :n]]
            xh, yh = d.train_x[d.holdout_index[k, :h]].double().flatten(1), d.train_y[d.holdout_index[k, :h]]
            if check:  # v ← v − η(∇F_k(v; batch) + λ(v − w^r)), lfed's batches
                v = v_before[i].clone()
                for t in range(int(steps[i])):
                    b = local.index[i, pos[i, t][valid[i, t]]].cpu()
                    v = v.requires_grad_(True)
                    (g,) = torch.autograd.grad(F.cross_entropy(logits(v, d.train_x[b].double().flatten(1)), d.train_y[b]), v)
                    v = (v - float(lr) * (g + self.lam * (v - w_r))).detach()
                self.max_err = max(self.max_err, float((v - v_after[i]).abs().max()))
            with torch.no_grad():
                rec = dict(round=r, k=k, first=not bool(started[i]),
                           acc_w=float((logits(w_r, xh).argmax(-1) == yh).double().mean()),
                           acc_v0=float((logits(v_before[i], xh).argmax(-1) == yh).double().mean()),
                           acc_v1=float((logits(v_after[i], xh).argmax(-1) == yh).double().mean()),
                           loss_v0=float(F.cross_entropy(logits(v_before[i], xt), yt)),
                           loss_v1=float(F.cross_entropy(logits(v_after[i], xt), yt)),
                           loss_w=float(F.cross_entropy(logits(w_r, xt), yt)),
                           dist=float((v_after[i] - w_r).norm()))
            self.log.append(rec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=160)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--lam", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input", choices=["raw", "inverted"], default="raw",
                   help="raw: LEAF's pixels (1.0 = white background); inverted: 1 - x (ink = 1, MNIST's convention)")
    p.add_argument("--check-rounds", type=int, nargs="*", default=[0, 1, 80, 159])
    p.add_argument("--writers", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    a = p.parse_args()
    torch.manual_seed(a.seed)
    dm = FederatedDataModule(dataset="femnist", num_clients=105, partition="natural", holdout_fraction=0.2,
                             client_validation_fraction=0.1, seed=a.seed)
    data_ref = [dm.build()]
    if a.input == "inverted":
        data_ref[0].train_x.mul_(-1).add_(1)
        data_ref[0].test_x.mul_(-1).add_(1)
    obj = ProbeDitto(a.lam, data_ref, set(a.check_rounds))
    m = FederatedModule(MLP(784, [200, 200], 62, norm="layer"), algorithm="fedavg", objective=obj, fraction=0.1,
                        training=dict(client_lr=a.lr, batch_size=20, local_epochs=1), seed=a.seed,
                        evaluation=dict(round_local_accuracy=False))
    run_rounds(m, dm, rounds=a.rounds, precision="32-true")
    print(f"input {a.input}: Ditto lam {a.lam} lr {a.lr} rounds {a.rounds}: by-hand personal update vs lfed, max |diff| over the "
          f"participations of rounds {a.check_rounds}: {obj.max_err:.2e}")
    by = defaultdict(list)
    for rec in obj.log:
        by[rec["k"]].append(rec)
    parts = torch.tensor([len(by[k]) for k in range(105)], dtype=torch.float64)
    firsts = torch.tensor([by[k][0]["round"] for k in range(105) if by[k]], dtype=torch.float64)
    print(f"participations a writer: mean {float(parts.mean()):.1f} min {int(parts.min())} max {int(parts.max())}; "
          f"round of the first participation: median {float(firsts.median()):.0f}, max {int(firsts.max())}")
    for k in a.writers:
        print(f"writer {k}: round(first?) acc_w^r acc_v before->after | train loss w^r, v before->after | ||v - w^r||")
        for rec in by[k]:
            print(f"  r{rec['round']:3d}{'*' if rec['first'] else ' '} {rec['acc_w']:.3f} {rec['acc_v0']:.3f}->{rec['acc_v1']:.3f}"
                  f" | {rec['loss_w']:.3f} {rec['loss_v0']:.3f}->{rec['loss_v1']:.3f} | {rec['dist']:.2f}")
    for lo, hi in [(0, 40), (40, 80), (80, 120), (120, 160)]:
        rs = [r for r in obj.log if lo <= r["round"] < hi]
        if rs:
            mean = lambda key: sum(r[key] for r in rs) / len(rs)  # noqa: E731, B023
            print(f"rounds {lo}-{hi - 1}: {len(rs)} participations: held-out acc w^r {mean('acc_w'):.3f}, v before "
                  f"{mean('acc_v0'):.3f} after {mean('acc_v1'):.3f}; train loss w^r {mean('loss_w'):.3f}, v before "
                  f"{mean('loss_v0'):.3f} after {mean('loss_v1'):.3f}; ||v - w^r|| {mean('dist'):.2f}")


if __name__ == "__main__":
    main()
