"""The cost of personalized evaluation and of Ditto's second training (SPEC §11, issue 27).

    ../shared/tools/quiet-run python benchmarks/personal_eval.py                      # N = 100, 1,000, 10,000
    python benchmarks/personal_eval.py --clients 20 50 --rounds 2 3 --features 16     # a quick check

1. Evaluating every client's personalized model on its own held-out split, at N clients (each with
   ``--train`` training and ``--held`` held-out examples of ``--features`` inputs, 10 classes, the
   MLP 2NN of ``--hidden``), with Ditto's personal models ``v_k`` set for every client:
   * ``vmapped``: :meth:`lfed.core.run.FederatedRun.personal_evaluation` (``personal_chunk`` clients per
     vmapped call, lfed's way);
   * ``one by one``: the same accuracies, one client after another (``functional_call`` of the net with
     the client's row on its held-out examples), checked equal to the vmapped ones.
   FedAvg-FT's evaluation (its fine-tuning included) is timed beside them.
2. A Ditto round against a FedAvg round (same data, cohort, batches): the time per round from two
   fits of ``--rounds`` ``R1 < R2`` rounds, ``(t(R2) - t(R1)) / (R2 - R1)`` (set-up cancels).

Medians of ``--repeat`` timings (:mod:`harness`), the vmapped and the one-by-one evaluation taken in turn, each turn
started on a quiet machine; prints the device, torch's threads and the load average before and after. Nothing is
written.
"""

from __future__ import annotations

import harness
import torch
from torch.func import functional_call

#: Timings synchronize the device first and last.
SYNC = torch.cuda.synchronize if torch.cuda.is_available() else None


def median_seconds(f, n: int) -> float:
    """The median of ``n`` timings of ``f`` (no waiting: a caller's turn waited)."""
    return harness.measure(f, repeats=n, quiet=False, sync=SYNC).median


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_growth_mb(f) -> float | None:
    """How far the process's resident memory rose above where it was while ``f`` ran (MB): the peak RSS
    (VmHWM, reset through /proc/self/clear_refs) minus the RSS before. None where Linux does not allow it.
    On CUDA, torch's own peak allocation of the device instead."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        f()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as c:
            c.write("5")
    except OSError:
        return None
    before = _status_kb("VmRSS")
    f()
    peak = _status_kb("VmHWM")
    return None if before is None or peak is None else (peak - before) / 1024


def interleaved(fs, n: int) -> list[float]:
    """Medians of ``n`` timings of each of ``fs``, taken in turn (f0, f1, f0, f1, ...), so a change of load
    hits both. Each timing waits for the 1-minute load to fall below 1.0 (:func:`harness.wait_quiet`, the benchmark's
    own threads heat it) and prints it."""

    def log(i, turn, seconds, load, _) -> None:
        print(f"  turn {turn}: {i}: {seconds:.3f} s, load {load:.2f}", flush=True)

    runs = harness.interleave(dict(enumerate(fs)), repeats=n, sync=SYNC, log=log)
    return [runs[i].median for i in range(len(fs))]


def synthetic(num_clients: int, train: int, held: int, features: int, seed: int = 0):
    from lfed.lightning.datamodule import FederatedDataModule

    g = torch.Generator().manual_seed(seed)
    n = num_clients * (train + held)
    x = torch.randn(n, features, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return FederatedDataModule.from_tensors(x, y, x[:1000], y[:1000], num_clients=num_clients, partition="iid",
                                            holdout_fraction=held / (train + held), num_classes=10, seed=seed)


def module(objective, features: int, hidden: list[int], device: str, **kwargs):
    from lfed.lightning.module import FederatedModule
    from lfed.models.zoo import MLP

    torch.manual_seed(0)
    args = dict(objective=objective, fraction=0.1, training={"client_lr": 0.05, "batch_size": 10, "local_epochs": 1},
                seed=0)
    args.update(kwargs)  # engine={...}, evaluation={...}: lfed.core.settings' groups
    return FederatedModule(MLP(in_features=features, hidden=hidden, num_classes=10), **args)


def fit(m, dm, rounds: int, device: str):
    from lightning.pytorch import Trainer

    trainer = Trainer(max_steps=rounds, accelerator=device, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      check_val_every_n_epoch=None, val_check_interval=rounds, limit_val_batches=0)
    with harness.stopwatch() as sw:
        trainer.fit(m, datamodule=dm)
    elapsed = sw.seconds
    if device == "gpu":  # Lightning's teardown puts the module back on the CPU; the run's data stays on the device
        m.to("cuda")
    return elapsed


def one_by_one(run, clients, row_of) -> torch.Tensor:
    """Each client's accuracy on its held-out split, one client after another (``row_of(k)``: its model,
    read from the client state one row at a time, as a loop over clients would)."""
    d, net, layout = run.data, run.net, run.layout
    out = torch.empty(clients.numel(), dtype=torch.float64)
    net.eval()
    with torch.no_grad():
        for i, k in enumerate(clients.tolist()):
            h = int(d.holdout_sizes[k])
            idx = d.holdout_index[k, :h]
            pred = functional_call(net, layout.unflatten(row_of(k)), (d.train_x[idx],)).argmax(-1)
            out[i] = float((pred == d.train_y[idx]).double().mean())
    return out


def agreement(run, clients, row_of, loop: torch.Tensor, vmapped: torch.Tensor, margin: float = 1e-4) -> dict:
    """The loop's and the vmapped accuracies compared: ``equal`` to 1e-12 (on the CPU bit for bit), else each
    client that differs must have a near tie among its held-out examples: recomputed in float64 from its row,
    an example whose two largest logits are within ``margin`` (relative). On a GPU the two paths run other
    kernels (batched against single matrix products), and float32 round-off may then flip such an argmax;
    any other difference is a defect. Returns ``{"equal", "clients_differing", "explained"}``, and which side
    disagrees with the float64 accuracy (``loop_wrong``, ``vmapped_wrong``, the first clients' ``detail``)."""
    import copy

    loop, vmapped = loop.cpu(), vmapped.cpu()
    # accuracies are counts over a client's h examples: compared to 1e-12, since 3/5 is 0.6 as sum / h and
    # 0.6000000000000001 as CUDA's float64 mean() (seen on the H100); a flipped prediction moves it by 1/h
    differ = ((loop - vmapped).abs() > 1e-12).nonzero().squeeze(1).tolist()
    explained, gaps, detail = True, [], []
    if differ:
        d, layout = run.data, run.layout
        net = copy.deepcopy(run.net).double().eval()
        for i in differ:
            k = int(clients[i])
            idx = d.holdout_index[k, : int(d.holdout_sizes[k])]
            with torch.no_grad():
                logits = functional_call(net, {n: v.double() for n, v in layout.unflatten(row_of(k)).items()},
                                         (d.train_x[idx].double(),))
            acc64 = float((logits.argmax(-1) == d.train_y[idx]).double().mean())
            with torch.no_grad():
                glob = net(d.train_x[idx].double()).argmax(-1)  # the global model's (is one side reading it instead?)
            detail.append({"client": k, "float64": acc64, "loop": float(loop[i]), "vmapped": float(vmapped[i]),
                           "global_float64": float((glob == d.train_y[idx]).double().mean())})
            top = logits.topk(2, dim=-1).values
            gap = (top[:, 0] - top[:, 1]).abs() / top[:, 0].abs().clamp(min=1.0)
            explained = explained and bool((gap < margin).any())
            gaps.append(float(gap.min()))
    # the smallest float64 top-2 gap of each differing client: ~1e-6 and below is float32 round-off, ~1e-3 a
    # reduced-precision product (TF32) on one path, larger a defect
    return {"equal": not differ, "clients_differing": len(differ), "explained": not differ or explained,
            "smallest_gaps": sorted(gaps)[-5:], "loop_wrong": sum(x["loop"] != x["float64"] for x in detail),
            "vmapped_wrong": sum(x["vmapped"] != x["float64"] for x in detail), "detail": detail[:8]}


def evaluation(args, N: int, device: str) -> None:
    from lfed.engine.ranks import Ranks
    from lfed.personal.ditto import Ditto
    from lfed.personal.finetune import FedAvgFT

    dm = synthetic(N, args.train, args.held, args.features)
    placement = args.client_state
    if placement == "auto":  # a dense [N, P] float32 state above 2 GB: lazy rows in host memory
        placement = "host" if N * param_count(args) * 4 > 2**31 else "device"
    m = module(Ditto(lam=0.1), args.features, args.hidden, device, evaluation={"personal_chunk": args.chunk},
               engine={"client_state": placement, "client_state_dir": args.state_dir if placement == "disk" else None})
    fit(m, dm, 1, device)
    run = m.runs[0]
    clients = run.personal_sample()
    w = run.layout.module_vector(run.net)
    g = torch.Generator().manual_seed(1)
    for lo in range(0, clients.numel(), args.chunk):  # every client gets its own personal model
        c = clients[lo : lo + args.chunk]
        v = w + 0.01 * torch.randn(c.numel(), w.numel(), generator=g).to(w.device, w.dtype)
        m.objective.write_rows("personal", c, v)
    evaluated = (run.client_accuracy(), None)

    def personal_evaluation(r):
        return r.personal_evaluation(evaluated, Ranks(), lambda t: t, False, 2048)

    def row_of(k):
        return m.objective.rows("personal", torch.tensor([k], device=clients.device), first=w)[0]

    # both read their rows from the client state: the vmapped one a chunk at a time, the loop one row at a time
    t_vmap, t_loop = interleaved([lambda: personal_evaluation(run), lambda: one_by_one(run, clients, row_of)], args.repeats)
    vmapped = run.last_personal["personal"]
    agree = agreement(run, clients, row_of, one_by_one(run, clients, row_of), vmapped)
    mem_vmap = peak_growth_mb(lambda: personal_evaluation(run))
    mem_loop = peak_growth_mb(lambda: one_by_one(run, clients, row_of))
    assert agree["explained"], f"the two evaluations disagree beyond float32 near-ties: {agree}"
    ft = module(FedAvgFT(epochs=1), args.features, args.hidden, device, evaluation={"personal_chunk": args.chunk})
    fit(ft, dm, 1, device)
    ft_run = ft.runs[0]
    ft_evaluated = (ft_run.client_accuracy(), None)
    t_ft = median_seconds(lambda: ft_run.personal_evaluation(ft_evaluated, Ranks(), lambda t: t, False, 2048), args.repeats)
    same = "equal" if agree["equal"] else f"{agree['clients_differing']} clients differ (near ties)"
    print(f"N={N:>6}  P={run.layout.num_params:,}  client_state={placement}  vmapped {t_vmap:8.3f} s  one by one {t_loop:8.3f} s  "
          f"({t_loop / t_vmap:5.1f}x)  memory growth vmapped {mem_vmap:.0f} MB, one by one {mem_loop:.0f} MB  accuracies {same}  "
          f"FedAvg-FT (fine-tuning included) {t_ft:8.3f} s", flush=True)


def param_count(args) -> int:
    widths = [args.features, *args.hidden, 10]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def round_time(args, device: str) -> None:
    from lfed.personal.ditto import Ditto

    r1, r2 = args.rounds
    dm = synthetic(args.round_clients, args.train, args.held, args.features)
    out = {}
    for name, objective in (("fedavg", None), ("ditto", Ditto(lam=0.1))):
        t = [median_seconds(lambda r=r, o=objective: fit(module(o, args.features, args.hidden, device), dm, r, device),
                            args.repeats) for r in (r1, r2)]
        out[name] = (t[1] - t[0]) / (r2 - r1)
    print(f"round time, {args.round_clients} clients, C = 0.1: FedAvg {out['fedavg']:.4f} s, Ditto {out['ditto']:.4f} s "
          f"({out['ditto'] / out['fedavg']:.2f}x)", flush=True)


def main() -> None:
    p = harness.parser(__doc__, repeats=3, description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--train", type=int, default=20, help="training examples per client")
    p.add_argument("--held", type=int, default=5, help="held-out examples per client")
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--hidden", type=int, nargs="+", default=[200, 200])
    p.add_argument("--chunk", type=int, default=256, help="personal_chunk")
    p.add_argument("--rounds", type=int, nargs=2, default=[5, 25], help="R1 R2 of the round-time fits")
    p.add_argument("--round-clients", type=int, default=1000)
    p.add_argument("--no-round-time", action="store_true", help="skip part 2 (the Ditto round against a FedAvg round)")
    p.add_argument("--repeat", dest="repeats", type=int, help="--repeats' older spelling")
    p.add_argument("--client-state", default="auto", choices=["auto", "device", "host", "disk"],
                   help="where Ditto's personal models live (auto: host when a dense [N, P] state passes 2 GB)")
    p.add_argument("--state-dir", default="/tmp/lfed_personal_eval_state", help="the disk placement's folder")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    if args.quick:
        args.clients, args.features, args.hidden, args.rounds, args.round_clients, args.repeats = [20], 16, [16], [1, 2], 20, 1
    device = "gpu" if args.device == "cuda" else args.device
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, load before {harness.loadavg():.2f}")
    for N in args.clients:
        evaluation(args, N, device)
    if not args.no_round_time:
        round_time(args, device)
    print(f"load after {harness.loadavg():.2f}")


if __name__ == "__main__":
    main()
