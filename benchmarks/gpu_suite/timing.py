"""4. Timing of pfl-research's CIFAR-10 benchmark job (synthetic data): lfed, the hand-written vmap, the centralized
step, the plain loop, pfl, and a grid as one group (the package's docstring, item 4)."""

from __future__ import annotations

import math
import statistics
from functools import partial

import harness
import torch
import torch.nn.functional as F

from .common import PFL_A100_NOTE, PflCNN, Skipped, _f, _mem, _status, peak_memory, reset_peak, sync, train_flops_per_example, trainer_for


def run(suite, t: dict) -> None:
    s = suite.s
    t["job"] = (f"pfl-research CIFAR-10 benchmark job on SYNTHETIC CIFAR-shaped data (random images, random labels): "
                f"{s.num_clients} clients x {s.images_per_client} images of 3x{s.image_size}x{s.image_size}, FedAvg, "
                f"1 local epoch, batch {s.batch_size}, client lr 0.05, pfl's CNN, evaluation every {s.evaluate_every} rounds "
                f"(on {s.test_images} test images)")
    t["params"] = sum(p.numel() for p in PflCNN(image_size=s.image_size).parameters())
    t["pfl_a100"] = PFL_A100_NOTE
    t["warmup_rounds"], t["max_timed_rounds"], t["case_cap_s"] = s.warmup, s.timed, suite.args.case_cap_s
    suite.flops_per_example = train_flops_per_example(s.image_size, s.batch_size)
    t["train_flops_per_example"] = suite.flops_per_example
    t["flops_note"] = ("TFLOP/s = examples per round x FLOPs of one training step per example (forward + backward, "
                       "torch.utils.flop_counter.FlopCounterMode: matrix products and convolutions only) / steady s per round")
    last: dict[str, tuple[int, float]] = {}
    methods = {"lfed vmap": lambda k: suite.lfed_case("vmap", k), "lfed loop": lambda k: suite.lfed_case("loop", k),
               "lfed vmap, native conv": lambda k: suite.lfed_case("vmap", k, conv_form="native"),
               "lfed vmap, matmul conv": lambda k: suite.lfed_case("vmap", k, conv_form="matmul"),
               "plain loop": partial(plain_case, suite), "hand vmap": partial(hand_vmap_case, suite), "centralized": partial(centralized_case, suite),
               "pfl (1 process)": partial(pfl_case, suite)}
    # cheap and telling first: vmap at every cohort, the hand-written vmap and the centralized step, pfl at the
    # smallest cohort, then the loops, the grid, the loops and pfl at the largest cohort last
    order = [("lfed vmap", k) for k in s.cohorts]
    # the convolutions' two forms (lfed.engine.conv) forced, at the smallest cohort: the rule's choice against the other
    order += [("lfed vmap, native conv", s.cohorts[0]), ("lfed vmap, matmul conv", s.cohorts[0])]
    order += [(m, k) for m in ("hand vmap", "centralized") for k in s.cohorts]
    order += [("pfl (1 process)", k) for k in s.pfl_cohorts[:1]]
    order += [(m, k) for k in s.cohorts[:-1] for m in ("lfed loop", "plain loop")]
    tail = [(m, s.cohorts[-1]) for m in ("lfed loop", "plain loop")] + [("pfl (1 process)", k) for k in s.pfl_cohorts[1:]]
    for method, k in order:
        _time_method(suite, t, methods, last, method, k)
    section_grid(suite, t)
    for method, k in tail:
        _time_method(suite, t, methods, last, method, k)
    by = {(c["method"], c["cohort"]): c for c in t["cases"] if "cohort" in c}
    for (_, k), c in by.items():
        if c.get("status") != "ok":
            continue
        for key, ref in (("vs_plain_loop", "plain loop"), ("vs_hand_vmap", "hand vmap"), ("vs_centralized", "centralized")):
            r = by.get((ref, k))
            if r and r.get("status") == "ok":
                c[key] = c["steady_s_per_round"] / r["steady_s_per_round"]
    t["targets"] = targets(suite, by, t)


def targets(suite, by: dict, t: dict) -> list[dict]:
    """Issue 37's targets for the GPU, each with the measured ratio (None: a side not measured in this run)."""
    s, out = suite.s, []

    def ratio(k, a, b):
        x, y = by.get((a, k)), by.get((b, k))
        if x and y and x.get("status") == "ok" and y.get("status") == "ok":
            return x["steady_s_per_round"] / y["steady_s_per_round"]
        return None

    small, large = s.cohorts[0], s.cohorts[-1]
    for name, value, bound in ((f"lfed vmap / hand vmap, cohort {small}", ratio(small, "lfed vmap", "hand vmap"), 1.0),
                               (f"lfed vmap / centralized, cohort {small}", ratio(small, "lfed vmap", "centralized"), 3.0),
                               (f"lfed vmap / centralized, cohort {large}", ratio(large, "lfed vmap", "centralized"), 2.0)):
        out.append({"target": f"{name} <= {bound:g}", "value": value, "met": None if value is None else value <= bound})
    group = next((c for c in t.get("cases", []) if c.get("grid") == "group"), None)
    value = group.get("throughput_vs_one_run") if group else None
    out.append({"target": f"grid of {len(s.grid_lrs) * len(s.grid_seeds)} as one group: throughput >= 3x one run's",
                "value": value, "met": None if value is None else value >= 3.0})
    return out


def _time_method(suite, t, methods, last, method, k) -> None:
    s = suite.s
    est = None
    if method in last:
        k0, sec = last[method]
        est = sec * (k / k0) * (s.warmup + 3) * 1.5 + 5
    case = suite.timed_case(t, {"name": f"{method}, cohort {k}", "method": method, "cohort": k,
                               "examples_per_round": k * s.images_per_client}, lambda: methods[method](k), est)
    if case["status"] == "ok":
        last[method] = (k, case["steady_s_per_round"])


def section_grid(suite, t: dict) -> None:
    from lfed.lightning.group import GroupMember, RunGroup

    s = suite.s
    points = [(lr, seed) for lr in s.grid_lrs for seed in s.grid_seeds]
    k = s.grid_cohort

    def group():
        dm = suite.pfl_data()()
        members = [GroupMember(f"lr{lr:g}-s{seed}", suite.pfl_module("vmap", k, lr, seed), dm, {"client_lr": lr, "seed": seed})
                   for lr, seed in points]
        g = RunGroup(members)
        clock = suite.clock(s.warmup, suite.args.case_cap_s)
        reset_peak(suite.device)
        start = harness.clock()
        trainer_for(suite.device, s.warmup + s.grid_timed, "32-true", evaluate_every=s.evaluate_every,
                    callbacks=[clock]).fit(g, datamodule=g.datamodule)
        timed = clock.seconds[s.warmup:]
        return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "wall_s": harness.clock() - start,
                "engine_calls": g.engine_calls, **peak_memory(suite.device)}

    def sequential():
        per_run, peaks, timed, start = [], [], [], harness.clock()
        for lr, seed in points:
            if suite.budget_left() <= 0:
                raise TimeoutError(f"time budget ran out after {len(per_run)} of {len(points)} runs")
            clock = suite.clock(s.warmup, suite.args.case_cap_s)
            m = suite.pfl_module("vmap", k, lr, seed)
            reset_peak(suite.device)
            trainer_for(suite.device, s.warmup + s.grid_timed, "32-true", evaluate_every=s.evaluate_every,
                        callbacks=[clock]).fit(m, datamodule=suite.pfl_data()())
            per_run.append(clock.steady())
            timed += clock.seconds[s.warmup:]
            peaks.append(peak_memory(suite.device))
        key = next(iter(peaks[0]))
        return {"steady_s_per_round": sum(per_run), "per_run_steady_s": per_run, "timed_rounds": timed, "wall_s": harness.clock() - start,
                "note": "sum over the runs of each run's steady s/round", **peaks[0], key: max(p[key] for p in peaks)}

    n = len(points)
    vm = [c for c in t.get("cases", []) if c.get("method") == "lfed vmap" and c.get("status") == "ok"]
    est = None
    if vm:
        est = vm[0]["steady_s_per_round"] * n * (s.warmup + s.grid_timed) * 2 + 5 * n
    work = n * k * s.images_per_client
    a = suite.timed_case(t, {"name": f"grid of {n} runs as one group, cohort {k}", "grid": "group", "runs": n,
                            "examples_per_round": work}, group, None)
    b = suite.timed_case(t, {"name": f"grid of {n} runs one after another, cohort {k}", "grid": "sequential", "runs": n,
                            "examples_per_round": work}, sequential, est)
    if a["status"] == "ok" and b["status"] == "ok":
        a["vs_one_after_another"] = a["steady_s_per_round"] / b["steady_s_per_round"]
    one = next((c for c in vm if c.get("cohort") == k), None)
    if a["status"] == "ok" and one:
        # run-rounds per second of the group over rounds per second of one run alone (lfed vmap at this cohort)
        a["run_rounds_per_s"] = n / a["steady_s_per_round"]
        a["one_run_rounds_per_s"] = 1 / one["steady_s_per_round"]
        a["throughput_vs_one_run"] = a["run_rounds_per_s"] / a["one_run_rounds_per_s"]


def plain_case(suite, cohort: int) -> dict:
    """The least a per-client Python loop costs: one model, torch.optim.SGD per client, weighted mean."""
    s, dev = suite.s, suite.device
    suite.pfl_data()
    x, y = suite._pfl_tensors[0].to(dev), suite._pfl_tensors[1].to(dev)
    n = s.images_per_client
    torch.manual_seed(0)
    model = PflCNN(image_size=s.image_size).to(dev)
    glob = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(0)
    reset_peak(dev)

    def one_round() -> None:
        nonlocal glob
        acc = [torch.zeros_like(w) for w in glob]
        for k in torch.randperm(s.num_clients, generator=g)[:cohort].tolist():
            with torch.no_grad():
                for p, w in zip(model.parameters(), glob):
                    p.copy_(w)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            model.train()
            perm = (torch.randperm(n, generator=g) + k * n).to(dev)
            for b in range(0, n, s.batch_size):
                idx = perm[b:b + s.batch_size]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
            with torch.no_grad():
                for a, p in zip(acc, model.parameters()):
                    a.add_(p, alpha=n)
        glob = [a / (n * cohort) for a in acc]

    return {**manual_rounds(suite, one_round), "note": "no evaluation"}


def round_batches(suite, cohort: int, g: torch.Generator):
    """The round's clients and, per local step, their examples' indices ``[K, B]`` into the one data tensor
    (each client's examples in a fresh order, as every implementation here walks them)."""
    s, n = suite.s, suite.s.images_per_client
    clients = torch.randperm(s.num_clients, generator=g)[:cohort]
    order = torch.argsort(torch.rand(cohort, n, generator=g), dim=1) + clients[:, None] * n  # [K, n]
    order = order.to(suite.device)
    return [order[:, lo:lo + s.batch_size] for lo in range(0, n, s.batch_size)]


def manual_rounds(suite, body) -> dict:
    """Time ``body()`` (one round) as the other cases are: warm-up rounds, then timed ones, synchronized, capped."""
    s, dev = suite.s, suite.device
    rounds: list[float] = []
    start = harness.clock()
    for _ in range(s.warmup + s.timed):
        with harness.stopwatch(lambda: sync(dev)) as sw:
            body()
        rounds.append(sw.seconds)
        timed = rounds[s.warmup:]
        if len(timed) >= 3 and sum(timed) > suite.args.case_cap_s:
            break
    timed = rounds[s.warmup:]
    return {"steady_s_per_round": statistics.median(timed), "timed_rounds": timed, "warmup_rounds": rounds[:s.warmup],
            "wall_s": harness.clock() - start, **peak_memory(dev)}


def hand_vmap_case(suite, cohort: int) -> dict:
    """The obvious hand-written vmapped FedAvg (../shared/gpu/2026-11-26-h200/README.md, section 3): the
    cohort's weights stacked, one eager ``vmap(grad(loss(functional_call)))`` per local step, SGD in place,
    the mean as the new model; the round's examples gathered from one device tensor. Dropout on, as in the
    lfed rows (``randomness="different"``: each client its own masks)."""
    from torch.func import functional_call, grad, vmap

    s, dev = suite.s, suite.device
    suite.pfl_data()
    x, y = suite._pfl_tensors[0].to(dev), suite._pfl_tensors[1].to(dev)
    torch.manual_seed(0)
    model = PflCNN(image_size=s.image_size).to(dev).train()
    names = [name for name, _ in model.named_parameters()]
    state = {"glob": {name: q.detach().clone() for name, q in model.named_parameters()}}

    def loss(params, xb, yb):
        return F.cross_entropy(functional_call(model, params, (xb,)), yb)

    step_grad = vmap(grad(loss), randomness="different")
    g = torch.Generator().manual_seed(0)
    reset_peak(dev)

    def one_round():
        glob = state["glob"]
        w = {name: glob[name].expand(cohort, *glob[name].shape).clone() for name in names}
        for b in round_batches(suite, cohort, g):  # b: [K, B]
            grads = step_grad(w, x[b], y[b])
            for name in names:
                w[name].sub_(grads[name], alpha=0.05)
        state["glob"] = {name: w[name].mean(0) for name in names}  # equal sizes: the size-weighted mean

    return {**manual_rounds(suite, one_round), "note": "no evaluation; dropout on (randomness='different')"}


def centralized_case(suite, cohort: int) -> dict:
    """The work of a round without federation: per local step of the round, one forward/backward/SGD step of
    the single model over that step's K x B examples as one batch (same net, same device, same gathers)."""
    s, dev = suite.s, suite.device
    suite.pfl_data()
    x, y = suite._pfl_tensors[0].to(dev), suite._pfl_tensors[1].to(dev)
    torch.manual_seed(0)
    model = PflCNN(image_size=s.image_size).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    reset_peak(dev)

    def one_round():
        for b in round_batches(suite, cohort, g):
            idx = b.reshape(-1)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()

    steps = math.ceil(s.images_per_client / s.batch_size)
    return {**manual_rounds(suite, one_round), "steps_per_round": steps, "batch": cohort * s.batch_size,
            "note": f"{steps} steps of batch {cohort * s.batch_size} (K x B) a 'round'; no evaluation"}


def pfl_case(suite, cohort: int) -> dict:
    """pfl-research itself, one process: ``SimulatedBackend`` + ``FederatedAveraging`` + ``PyTorchModel``, its
    users' data given as device tensors (as in the shared README's section 3 and benchmarks/peers/pfl_job.py)."""
    try:
        import pfl
        from pfl.aggregate.simulate import SimulatedBackend
        from pfl.aggregate.weighting import WeightByDatapoints
        from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
        from pfl.callback.base import TrainingProcessCallback
        from pfl.data.federated_dataset import FederatedDataset
        from pfl.data.pytorch import PyTorchTensorDataset
        from pfl.data.sampling import get_user_sampler
        from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
        from pfl.metrics import Weighted
        from pfl.model.pytorch import PyTorchModel
    except Exception as err:  # noqa: BLE001
        raise Skipped(f"pfl not importable ({type(err).__name__}: {err})") from None
    s, dev, cap = suite.s, suite.device, suite.args.case_cap_s
    suite.pfl_data()
    x, y = suite._pfl_tensors[0].to(dev), suite._pfl_tensors[1].to(dev)
    n = s.images_per_client

    class Net(PflCNN):  # the methods pfl's PyTorchModel calls
        def loss(self, xb, yb, eval=False):  # noqa: A002 - pfl's signature
            self.eval() if eval else self.train()
            return F.cross_entropy(self(xb), yb)

        @torch.no_grad()
        def metrics(self, xb, yb, eval=True):  # noqa: A002
            self.eval()
            out = self(xb)
            return {"loss": Weighted(float(F.cross_entropy(out, yb, reduction="sum")), len(yb)),
                    "accuracy": Weighted(float((out.argmax(-1) == yb).sum()), len(yb))}

    marks: list[float] = []

    class Clock(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            sync(dev)
            marks.append(harness.clock())
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            sync(dev)
            marks.append(harness.clock())
            timed = [b - a for a, b in zip(marks[s.warmup:], marks[s.warmup + 1:])]
            return len(timed) >= 3 and sum(timed) > cap, type(aggregate_metrics)()

    def make_user(uid):
        perm = torch.randperm(n, device=dev) + uid * n
        return PyTorchTensorDataset((x[perm], y[perm]), user_id=uid)

    torch.manual_seed(0)
    net = Net(image_size=s.image_size).to(dev)
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    data = FederatedDataset(make_user, get_user_sampler("minimize_reuse", list(range(s.num_clients))))
    rounds = s.warmup + s.timed
    reset_peak(dev)
    start = harness.clock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds + 1,
                                           train_cohort_size=cohort, val_cohort_size=0),
        backend=SimulatedBackend(training_data=data, val_data=None, postprocessors=[WeightByDatapoints()]),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=0.05, local_num_epochs=1, local_batch_size=s.batch_size),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[Clock()])
    per = [b - a for a, b in zip(marks, marks[1:])]
    return {"steady_s_per_round": statistics.median(per[s.warmup:]), "timed_rounds": per[s.warmup:],
            "warmup_rounds": per[:s.warmup], "wall_s": harness.clock() - start, "pfl_version": pfl.__version__,
            "note": "one process; no evaluation", **peak_memory(dev)}


def markdown(t: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if t:
        L += ["## Timing", "", t.get("job", ""), "", f"Model parameters: {t.get('params', 0):,}. {t.get('pfl_a100', '')}.", "",
              f"Steady s/round = median of the timed rounds (after {t.get('warmup_rounds')} warm-up rounds; at most "
              f"{t.get('max_timed_rounds')}, fewer once a case spent {t.get('case_cap_s')} s); evaluation not included.", "",
              f"{t.get('flops_note', '-')}; {_f(t.get('train_flops_per_example', 0) / 1e6)} MFLOP per example here. "
              "*centralized*: the same steps as a round, each over the round's K x B examples as one batch of one model. "
              "*hand vmap*: the shared README's ~60 lines (stacked weights, eager vmap(grad) per step, the mean).", "",
              "| case | status | steady s/round | TFLOP/s | timed rounds | vs plain loop | vs hand vmap | vs centralized | "
              "s per evaluation | peak memory |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in t.get("cases", []):
            if "grid" in c:
                continue
            ev = c.get("eval_s") or []
            L.append(f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('tflops'), 3)} | "
                     f"{len(c.get('timed_rounds', []))} | {_f(c.get('vs_plain_loop'), 3)} | {_f(c.get('vs_hand_vmap'), 3)} | "
                     f"{_f(c.get('vs_centralized'), 3)} | {_f(statistics.median(ev)) if ev else '-'} | {_mem(c)} |")
        L += ["", "Grid: throughput vs one run = the group's run-rounds per second over one run's rounds per second "
              "(lfed vmap at the same cohort, above).", "",
              "| grid | status | s/round | TFLOP/s | run-rounds/s | throughput vs one run | vs one after another | engine calls | "
              "peak memory |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in t.get("cases", []):
            if "grid" in c:
                L.append(f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('tflops'), 3)} | "
                         f"{_f(c.get('run_rounds_per_s'), 3)} | {_f(c.get('throughput_vs_one_run'), 3)} | "
                         f"{_f(c.get('vs_one_after_another'), 3)} | {_f(c.get('engine_calls'))} | {_mem(c)} |")
        if t.get("targets"):
            L += ["", "Issue 37's targets (on a GPU; '-' = a side not measured in this run):", "", "| target | value | met |",
                  "| --- | --- | --- |"]
            L += [f"| {g['target']} | {_f(g['value'], 3)} | {_f(g['met'])} |" for g in t["targets"]]
        L.append("")
    return L
