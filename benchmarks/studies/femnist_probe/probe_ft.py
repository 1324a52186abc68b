"""Issue 39, FEMNIST anomaly: FedAvg-FT measured by hand (float64, plain torch) against lfed.

Trains FedAvg on the study's setting (configs/paper/personal/femnist.yaml) for R rounds, then for a few
writers: the global model's accuracy on the writer's held-out split, then after each fine-tuning step
(plain SGD on the writer's TRAIN split, the lfed batches), and lfed's own personal row for the writer.

    PYTHONPATH=. python benchmarks/studies/femnist_probe/probe_ft.py --rounds 160 --lr 0.03
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from conftest import run_rounds  # noqa: E402

from lfed.engine import batch_schedule  # noqa: E402
from lfed.engine.ranks import Ranks  # noqa: E402
from lfed.lightning.datamodule import FederatedDataModule  # noqa: E402
from lfed.lightning.module import FederatedModule  # noqa: E402
from lfed.models.zoo import MLP  # noqa: E402
from lfed.personal.finetune import FedAvgFT  # noqa: E402
from lfed.rng import round_generator  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=160)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--ft-lr", type=float, default=None)
    p.add_argument("--writers", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input", choices=["raw", "inverted"], default="raw",
                   help="raw: LEAF's pixels (1.0 = white background); inverted: 1 - x (ink = 1, MNIST's convention)")
    p.add_argument("--ft-lrs", type=float, nargs="+", default=[0.001, 0.003, 0.01, 0.03])
    p.add_argument("--sharpness", action="store_true", help="top Hessian eigenvalue of each writer's training loss at w")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    dm = FederatedDataModule(dataset="femnist", num_clients=105, partition="natural", holdout_fraction=0.2,
                             client_validation_fraction=0.1, seed=a.seed)
    if a.input == "inverted":
        data = dm.build()
        data.train_x.mul_(-1).add_(1)
        data.test_x.mul_(-1).add_(1)
    net = MLP(784, [200, 200], 62, norm="layer")
    m = FederatedModule(net, algorithm="fedavg", objective=FedAvgFT(epochs=1, lr=a.ft_lr), fraction=0.1,
                        training=dict(client_lr=a.lr, batch_size=20, local_epochs=1), seed=a.seed,
                        evaluation=dict(round_local_accuracy=False))
    run_rounds(m, dm, rounds=a.rounds, precision="32-true")
    run = m.runs[0]
    d = run.data
    w32 = run.layout.module_vector(run.net).detach()
    layout, mnet = run.layout, run.net
    N = d.num_clients
    clients = torch.arange(N)
    print(f"input {a.input} rounds {a.rounds} client_lr {a.lr} rounds_done {run.rounds_done} P {w32.numel()}")
    print("train sizes", d.client_sizes[a.writers].tolist(), "held-out", d.holdout_sizes[a.writers].tolist(),
          "val", d.client_val_sizes[a.writers].tolist())
    # lfed's personal rows (the whole evaluated set in one chunk of 105, as in the study: personal_chunk 256)
    local = run.local_work(clients, Ranks())
    rows = m.objective.personal_rows(clients, w32, local).detach()
    steps = m.objective.fine_tune_steps(d.client_sizes, 20)
    ft_lr = a.ft_lr if a.ft_lr is not None else a.lr
    # the same batches lfed draws: (seed, rounds done, "finetune") over the chunk's 105 clients
    pos, valid = batch_schedule(d.client_sizes, int(steps.max()), 20, round_generator(a.seed, run.rounds_done, "finetune"))

    net64 = MLP(784, [200, 200], 62, norm="layer").double()
    names = [n for n, _ in net64.named_parameters()]

    def unflat(w):
        out, at = {}, 0
        for n, t in net64.named_parameters():
            out[n] = w[at : at + t.numel()].view_as(t)
            at += t.numel()
        return out

    # check the flat layout is the module's named-parameter order
    lay = layout.unflatten(w32)
    assert list(lay) == names, (list(lay), names)

    def acc(w, x, y):
        with torch.no_grad():
            return float((functional_call(net64, unflat(w), (x,)).argmax(-1) == y).double().mean())

    for k in a.writers:
        n, h = int(d.client_sizes[k]), int(d.holdout_sizes[k])
        tr = d.client_index[k, :n]
        ho = d.holdout_index[k, :h]
        xt, yt = d.train_x[tr].double().flatten(1), d.train_y[tr]
        xh, yh = d.train_x[ho].double().flatten(1), d.train_y[ho]
        assert not set(tr.tolist()) & set(ho.tolist())
        v = w32.double().clone()
        hist = [acc(v, xh, yh)]
        losses = []
        for t in range(int(steps[k])):
            b = pos[k, t][valid[k, t]]
            v = v.detach().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(functional_call(net64, unflat(v), (xt[b],)), yt[b])
            (g,) = torch.autograd.grad(loss, v)
            losses.append(float(loss))
            v = (v - ft_lr * g).detach()
            hist.append(acc(v, xh, yh))
        def full_loss(w):
            return torch.nn.functional.cross_entropy(functional_call(net64, unflat(w), (xt,)), yt)  # noqa: B023 (used in this iteration)

        def held_loss(w):
            with torch.no_grad():
                return float(torch.nn.functional.cross_entropy(functional_call(net64, unflat(w), (xh,)), yh))  # noqa: B023

        lfed_row_acc = acc(rows[k].double(), xh, yh)
        w64 = w32.double()
        extra = ""
        if a.sharpness:  # power iteration on Hessian-vector products of the full training loss
            u = torch.randn_like(w64, generator=torch.Generator().manual_seed(1))
            u /= u.norm()
            lam = 0.0
            for _ in range(30):
                wv = w64.clone().requires_grad_(True)
                (g,) = torch.autograd.grad(full_loss(wv), wv, create_graph=True)
                (hv,) = torch.autograd.grad(g @ u, wv)
                lam = float(hv @ u)
                u = hv / hv.norm()
            extra = f" | lambda_max(H_k) {lam:.1f} (2/lr = {2 / ft_lr:.1f})"
        sweep = []
        for lr2 in a.ft_lrs:
            v2 = w64.clone()
            for t in range(int(steps[k])):
                b = pos[k, t][valid[k, t]]
                v2 = v2.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(
                    functional_call(net64, unflat(v2), (xt[b],)), yt[b]), v2)
                v2 = (v2 - lr2 * g).detach()
            with torch.no_grad():
                sweep.append(f"lr {lr2}: train loss {float(full_loss(w64)):.3f}->{float(full_loss(v2)):.3f} "
                             f"held-out loss {held_loss(w64):.3f}->{held_loss(v2):.3f} acc {acc(w64, xh, yh):.3f}->{acc(v2, xh, yh):.3f}")
        print(f"writer {k} sweep (1 epoch, lfed's batches): " + "; ".join(sweep) + extra)
        print(f"writer {k}: n_train {n} held-out {h} steps {int(steps[k])}: held-out acc by step "
              + " ".join(f"{x:.3f}" for x in hist) + f" | lfed row {lfed_row_acc:.3f}"
              + f" | max |row - hand| {float((rows[k].double() - v).abs().max()):.2e}"
              + " | batch losses " + " ".join(f"{x:.2f}" for x in losses))
    # all writers: lfed's numbers
    from lfed.evaluation.scores import local_accuracy
    g_acc = local_accuracy(mnet, layout, w32.expand(N, -1), d, clients)
    p_acc = local_accuracy(mnet, layout, rows, d, clients)
    print(f"all {N} writers: global mean {float(g_acc.nanmean()):.4f} personal (lfed rows) mean {float(p_acc.nanmean()):.4f}")
    for lr2 in a.ft_lrs:  # lfed's FedAvg-FT at other fine-tuning lrs, every writer
        rows2 = FedAvgFT(epochs=1, lr=lr2).personal_rows(clients, w32, run.local_work(clients, Ranks())).detach()
        print(f"  FedAvg-FT fine-tuning lr {lr2}: personal mean over the {N} writers "
              f"{float(local_accuracy(mnet, layout, rows2, d, clients).nanmean()):.4f}")
    if a.sharpness:  # the pooled training loss of all writers (size-weighted: what FedAvg's average descends)
        idx = torch.cat([d.client_index[k, : int(d.client_sizes[k])] for k in range(N)])
        xa, ya = d.train_x[idx].double().flatten(1), d.train_y[idx]
        w64 = w32.double()
        u = torch.randn(w64.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        u /= u.norm()
        for _ in range(30):
            wv = w64.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(functional_call(net64, unflat(wv), (xa,)), ya), wv,
                                       create_graph=True)
            (hv,) = torch.autograd.grad(g @ u, wv)
            lam = float(hv @ u)
            u = hv / hv.norm()
        print(f"pooled training loss of the {N} writers: lambda_max {lam:.1f} (2/client_lr = {2 / a.lr:.1f})")


if __name__ == "__main__":
    main()
