"""Engine vs the limit: CohortTrainer.train against a plain PyTorch loop, same examples, same device.

For each model and cohort size K this times one FedAvg round of local training (evaluation
excluded) three ways, interleaved in one process and repeated:

* ``plain``: the standard PyTorch loop, one client after another: a model per client loaded with
  the broadcast weights, ``torch.optim.SGD``, and per batch ``opt.zero_grad(); loss =
  F.cross_entropy(model(x), y); loss.backward(); opt.step()``;
* ``vmap`` and ``loop``: ``lfed.CohortTrainer(backend=...).train`` on the same clients.

All three draw the same batches (lfed's :func:`lfed.engine.batch_schedule`, computed inside the
timed region by each), so they do the same arithmetic: the script checks once per setting that
the three give the same client weights. The runners rotate their order every repeat (:mod:`harness`), each
timed run started on a quiet machine. Throughput is client examples per second; the figure is the ratio
``lfed / plain`` per repeat, reported as the median over repeats.

    python benchmarks/engine_throughput.py                      # MLP 2NN (MNIST) and CIFAR CNN, K = 10, 50, 100
    python benchmarks/engine_throughput.py --models mlp --cohorts 10 --repeats 3
    python benchmarks/engine_throughput.py --compare-engine /tmp/engine_before.py   # before/after column

``--compare-engine FILE`` loads another ``engine.py`` (e.g. ``git show 2cdf1bd:lfed/engine.py``: a one-file
engine, as lfed's was before ``lfed/engine/`` became a package) and times its CohortTrainer too, as
``old-vmap`` / ``old-loop``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import statistics
import sys

import harness
import torch
import torch.nn.functional as F

import lfed  # noqa: F401  (first: lfed sets its OpenMP defaults before torch loads; the plain loop shares them)
from lfed.engine import CohortTrainer, StepRule, batch_schedule
from lfed.engine.params import ParamLayout
from lfed.models.zoo import MLP, McMahanCIFARCNN


def load_mnist(data_dir: str | None, n: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The first ``n`` MNIST training images (lfed's loader), or random ones if MNIST is absent."""
    try:
        from lfed.data.datasets import load_dataset

        ds = load_dataset("mnist", data_dir)
        return ds.train_x[:n].contiguous(), ds.train_y[:n].contiguous(), "MNIST"
    except (FileNotFoundError, ValueError):
        g = torch.Generator().manual_seed(0)
        return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g), "random 28x28"


def make_setting(model: str, K: int, n: int, data_dir: str | None):
    """Model, pooled data and a ``[K, n]`` client index (disjoint clients where the data allows)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if model == "mlp":
        net, (x, y, source) = MLP(784, (200, 200), 10), load_mnist(data_dir, 60000)
    elif model == "cnn":
        net = McMahanCIFARCNN(num_classes=10, image_size=32)
        m = min(K * n, 50000)
        x, y, source = torch.rand(m, 3, 32, 32, generator=g), torch.randint(0, 10, (m,), generator=g), "random 3x32x32"
    else:
        raise ValueError(f"model: {model!r} is not one of mlp, cnn")
    if K * n <= x.shape[0]:
        index = torch.randperm(x.shape[0], generator=g)[: K * n].view(K, n)
    else:
        index = torch.stack([torch.randperm(x.shape[0], generator=g)[:n] for _ in range(K)])
    return net, x, y, index, source


def plain_loop(net, w0, x, y, index, n, steps, lr, batch_size, seed) -> torch.Tensor:
    """The standard PyTorch loop over the clients; returns ``[K, P]`` final weights."""
    K = index.shape[0]
    sizes = torch.full((K,), n)
    positions, valid = batch_schedule(sizes, steps, batch_size, torch.Generator().manual_seed(seed))
    counts = valid.sum(-1)
    model = copy.deepcopy(net)  # one model object, reloaded per client (what a simulation loop does)
    params = list(model.parameters())
    finals = []
    for k in range(K):
        torch.nn.utils.vector_to_parameters(w0.clone(), params)  # (it aliases its input)
        opt = torch.optim.SGD(params, lr=lr)
        for t in range(steps):
            ids = index[k, positions[k, t, : counts[k, t]]]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[ids]), y[ids])
            loss.backward()
            opt.step()
        finals.append(torch.nn.utils.parameters_to_vector(params).detach())
    return torch.stack(finals)


def lfed_round(trainer, w0, x, y, index, n, steps, lr, batch_size, seed) -> torch.Tensor:
    K = index.shape[0]
    res = trainer.train(
        w0, x, y, index, torch.full((K,), n), torch.full((K,), steps), StepRule(), lr, batch_size,
        torch.Generator().manual_seed(seed),
    )
    return res.weights


def load_engine(path: str):
    spec = importlib.util.spec_from_file_location("lfed_engine_compare", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def runners_of(net, x, y, index, n, steps, args, old) -> dict:
    """``{name: seed -> [K, P] weights}``: the plain loop, each of lfed's backends (and ``old``'s)."""
    w0 = ParamLayout.from_module(net).module_vector(net)

    def with_engine(tr):
        return lambda seed: lfed_round(tr, w0, x, y, index, n, steps, args.lr, args.batch_size, seed)

    runners = {"plain": lambda seed: plain_loop(net, w0, x, y, index, n, steps, args.lr, args.batch_size, seed)}
    for b in args.backends.split(","):
        runners[b] = with_engine(CohortTrainer(net, backend=b))
        if old is not None:
            runners[f"old-{b}"] = with_engine(old.CohortTrainer(net, backend=b))
    return runners


def main() -> None:
    p = harness.parser(__doc__, repeats=5, out=None, out_flags=("--json",), out_help="also write the results here")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--cohorts", default="10,50,100")
    p.add_argument("--backends", default="vmap,loop")
    p.add_argument("--mlp-examples", type=int, default=600, help="examples per client for the MLP (job 2: 600)")
    p.add_argument("--cnn-examples", type=int, default=50, help="examples per client for the CNN")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--compare-engine", default=None, help="another engine.py to time beside this one")
    args = p.parse_args()
    if args.quick:
        args.models, args.cohorts, args.mlp_examples, args.repeats = "mlp", "2", 20, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    old = load_engine(args.compare_engine) if args.compare_engine else None
    rows = []
    print(harness.machine_line())
    for model in args.models.split(","):
        n = args.mlp_examples if model == "mlp" else args.cnn_examples
        steps = -(-n // args.batch_size)
        for K in [int(k) for k in args.cohorts.split(",")]:
            net, x, y, index, source = make_setting(model, K, n, args.data_dir)
            runners = runners_of(net, x, y, index, n, steps, args, old)
            # same arithmetic: every runner gives the plain loop's weights (float32 round-off)
            ref = runners["plain"](0)
            check = {name: float((run(0) - ref).abs().max()) for name, run in runners.items() if name != "plain"}
            seeds = dict.fromkeys(runners, 0)  # each timed run its own seed: 1, 2, ...

            def timed(name, seeds=seeds, runners=runners):
                seeds[name] += 1
                return runners[name](seeds[name])

            runs = harness.interleave({name: (lambda name=name: timed(name)) for name in runners}, repeats=args.repeats,
                                      order="rotate")
            times = {name: t.samples for name, t in runs.items()}
            examples = K * n
            row = {"model": model, "K": K, "examples_per_client": n, "steps": steps, "data": source,
                   "max_abs_diff_vs_plain": check}
            for name, ts in times.items():
                row[f"{name}_examples_per_s"] = examples / statistics.median(ts)
                if name != "plain":
                    row[f"{name}_ratio"] = statistics.median(p_ / t for p_, t in zip(times["plain"], ts))
            rows.append(row)
            cols = " ".join(
                f"{name}={row[f'{name}_examples_per_s']:,.0f}/s" + (f" (x{row[f'{name}_ratio']:.2f})" if name != "plain" else "")
                for name in times
            )
            print(f"{model} K={K} n={n}: {cols}; max|w - w_plain| {max(check.values()):.1e} "
                  f"(load {harness.load_range(harness.all_loads(runs.values()))})", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
