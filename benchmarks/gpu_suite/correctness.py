"""1. Correctness on the device, each check with an explicit tolerance and the max difference seen."""

from __future__ import annotations

from pathlib import Path

import torch

from .common import _f, diff, flat, state_diff, trainer_for


def run(suite, c: dict) -> None:
    s, dev = suite.s, suite.device
    f64 = "64-true"
    tol = 1e-10

    def vmap_loop(name, make, algorithm, rounds, **model):
        w = {}
        for backend in ("vmap", "loop"):
            m = suite.quickstart(backend, torch.float64, algorithm, net=make, **model)
            trainer_for(dev, rounds, f64).fit(m, datamodule=suite.digits())
            w[backend] = flat(m)
        d, rel = diff(w["vmap"], w["loop"])
        suite.check(c, f"vmap vs loop, float64: {name}", rel <= tol, f"max|Δ| / max|w| <= {tol:g}", d, relative=rel,
                   rounds=rounds, params=w["vmap"].numel())

    from lfed.models.zoo import SmallCNN

    suite.guarded(c, "vmap vs loop, float64: quickstart MLP (FedAvg)", f"relative <= {tol:g}",
                 lambda: vmap_loop("quickstart MLP (FedAvg)", None, "fedavg", s.correct_rounds))
    cnn_cases = {
        "scaffold": {},
        "igfl_s_time": {},
        "efl": {"channel": 0.3, "stragglers": {"p_inactive": 0.1, "p_incomplete": 0.4},
                "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 8}}},
    }
    for algorithm in s.algorithms:
        label = f"SmallCNN {algorithm}" + (" (compression 0.3, stragglers)" if algorithm == "efl" else "")
        suite.guarded(c, f"vmap vs loop, float64: {label}", f"relative <= {tol:g}",
                     lambda a=algorithm, lab=label: vmap_loop(lab, SmallCNN, a, s.correct_rounds, **cnn_cases[a]))

    def device_vs_cpu():
        w = {}
        for where in ("cpu", str(dev)):
            m = suite.quickstart("auto", torch.float32)
            trainer_for(torch.device(where), s.device_cpu_rounds, "32-true").fit(m, datamodule=suite.digits())
            w[where] = flat(m)
        d, rel = diff(w[str(dev)], w["cpu"])
        tol32 = 1e-4
        suite.check(c, f"quickstart float32: {dev} vs cpu", rel <= tol32, f"max|Δ| / max|w| <= {tol32:g} (float32 round-off)",
                   d, relative=rel, rounds=s.device_cpu_rounds, bit_identical=bool(d == 0.0))

    suite.guarded(c, f"quickstart float32: {dev} vs cpu", "relative <= 1e-4", device_vs_cpu)

    resume_model = {
        "efl": {"channel": 0.3, "stragglers": {"p_inactive": 0.1, "p_incomplete": 0.4},
                "objective": {"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 8}}},
        "igfl_s_time": dict(stragglers={"p_inactive": 0.2}),
        "fedavg": {},
    }

    def resume(algorithm):
        root = Path(suite.tmp.name) / f"resume_{algorithm}"
        whole = suite.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
        trainer_for(dev, 6, "32-true", evaluate_every=3, root=str(root)).fit(whole, datamodule=suite.digits())
        # the same uninterrupted run again: tells a resume bug from a non-deterministic device kernel
        repeat = suite.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
        trainer_for(dev, 6, "32-true", evaluate_every=3, root=str(root)).fit(repeat, datamodule=suite.digits())
        repeat_same = state_diff(repeat.state_dict(), whole.state_dict())[0]
        first = suite.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
        t = trainer_for(dev, 3, "32-true", evaluate_every=3, root=str(root))
        t.fit(first, datamodule=suite.digits())
        ckpt = root / "round3.ckpt"
        t.save_checkpoint(ckpt)
        again = suite.quickstart("auto", torch.float32, algorithm, **resume_model[algorithm])
        trainer_for(dev, 6, "32-true", evaluate_every=3, root=str(root)).fit(again, datamodule=suite.digits(), ckpt_path=str(ckpt))
        same, worst, bad = state_diff(again.state_dict(), whole.state_dict())
        d, _ = diff(flat(again), flat(whole))
        evals_same = [a for a in again.eval_history] == [b for b in whole.eval_history]
        suite.check(c, f"stop at 3, resume to 6 on {dev}: {algorithm}", same and d == 0.0 and evals_same,
                   "bit for bit (state dict, weights, evaluation history)", max(d, worst), differing_keys=bad[:10],
                   eval_history_same=evals_same, uninterrupted_run_repeats_bit_for_bit=repeat_same,
                   rounds_done=again.runs[0].rounds_done)

    for algorithm in s.resume_cases:
        suite.guarded(c, f"stop at 3, resume to 6 on {dev}: {algorithm}", "bit for bit", lambda a=algorithm: resume(a))

    def host_vs_device():
        runs = {}
        for placement in ("device", "host"):
            m = suite.quickstart("auto", torch.float32, "scaffold", engine={"client_state": placement}, stragglers={"p_incomplete": 0.3})
            trainer_for(dev, s.correct_rounds, "32-true").fit(m, datamodule=suite.digits())
            runs[placement] = m
        same, worst, bad = state_diff(runs["host"].state_dict(), runs["device"].state_dict())
        d, _ = diff(flat(runs["host"]), flat(runs["device"]))
        pinned = [getattr(r, "pinned", None) for r in runs["host"].store._rows.values()]
        ok = same and d == 0.0 and (dev.type != "cuda" or all(pinned))
        suite.check(c, f"client_state host vs device on {dev}: scaffold", ok,
                   "bit for bit" + (" and host rows pinned" if dev.type == "cuda" else ""), max(d, worst),
                   differing_keys=bad[:10], host_rows_pinned=pinned)

    suite.guarded(c, f"client_state host vs device on {dev}: scaffold", "bit for bit", host_vs_device)

    def robust():
        """Every robust rule and every attack drawing no random numbers (docs/robustness.md) on a fixed float64
        [K=15, P=40] cohort of updates, on the device against the CPU; then Krum's pick is compared exactly."""
        from lfed.base.component import Cohort
        from lfed.core.registry import NAMES, build_component

        g = torch.Generator().manual_seed(0)
        x = torch.randn(15, 40, generator=g, dtype=torch.float64)
        a = torch.rand(15, generator=g, dtype=torch.float64)
        byz = torch.zeros(15, dtype=torch.bool)
        byz[:3] = True
        out, worst = {}, 0.0
        for where in ("cpu", str(dev)):
            d = torch.device(where)

            def cohort(d=d):
                k = torch.arange(15)
                co = Cohort(0, k.to(d), torch.full((15,), 2, device=d), torch.ones(15, dtype=torch.long, device=d),
                            torch.ones(15, dtype=torch.long, device=d), 15, counting=torch.ones(15, dtype=torch.bool, device=d),
                            expected_size=15.0, seed=0, byzantine=byz.to(d))
                co.host_values().byzantine = byz
                return co

            for name in NAMES["combination"]:
                if name in ("dp_fedavg", "self", "global", "time", "fltrust", "secagg", "distributed_dp"):  # not robust rules
                    continue
                rule = build_component("combination", name, **({} if name in ("mean", "geometric_median",
                                                                              "centered_clipping", "norm_bound") else {"f": 3}))
                if name == "centered_clipping":
                    from lfed.state.spec import ModuleStateStore

                    rule.setup_state(ModuleStateStore(), torch.ones(15), 40, x.to(d))
                delta = rule.combine(x.to(d), a.to(d), cohort())
                out.setdefault(f"rule {name}", []).append((delta[0] if isinstance(delta, tuple) else delta).cpu())
            for name in NAMES["attack"]:
                if name in ("none", "gaussian", "label_flip", "backdoor"):
                    continue
                attack = build_component("attack", name, per_round=3)
                out.setdefault(f"attack {name}", []).append(attack.poison(x.to(d), cohort()).cpu())
        for cpu, there in out.values():
            worst = max(worst, diff(there, cpu)[1])
        tol = 1e-10
        suite.check(c, f"robust rules and attacks, float64: {dev} vs cpu", worst <= tol, f"max|Δ| / max|x| <= {tol:g}",
                   worst, cases=len(out))

    suite.guarded(c, f"robust rules and attacks, float64: {dev} vs cpu", "relative <= 1e-10", robust)

    def batch_norm():
        """A BatchNorm ResNet-20 with crop-and-flip augmentation (issue 53; docs/vision.md): the vmap backend on the
        device against the loop backend on the device and the vmap backend on the CPU, float64, weights and every
        running statistic, stragglers and partial batches included."""
        from lfed.data.augment import build_augmentation
        from lfed.engine import CohortTrainer, StepRule
        from lfed.models import ResNet20

        g = torch.Generator().manual_seed(0)
        x, y = torch.rand(48, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (48,), generator=g)
        index, sizes = torch.arange(48).view(4, 12), torch.tensor([12, 7, 10, 9])
        steps = torch.tensor([3, 2, 3, 1])
        torch.manual_seed(0)
        net = ResNet20(width=4).double()
        aug = build_augmentation("crop_flip")
        res = {}
        for where, backend in (("cpu", "vmap"), (str(dev), "vmap"), (str(dev), "loop")):
            d = torch.device(where)
            tr = CohortTrainer(net.to(d), backend=backend)
            r = tr.train(tr.layout.module_vector(net), x.to(d), y.to(d), index.to(d), sizes.to(d), steps, StepRule(),
                         0.05, 4, torch.Generator().manual_seed(1), augment=(aug, torch.Generator().manual_seed(2)))
            res[where, backend] = [r.weights.cpu(), *[b.cpu().double() for b in r.buffers.values()]]
        net.to("cpu")
        worst = 0.0
        ref = res["cpu", "vmap"]
        for got in res.values():
            for a, b in zip(got, ref):
                worst = max(worst, diff(a, b)[1])
        tol = 1e-10
        suite.check(c, f"BatchNorm ResNet-20 with augmentation, float64: vmap and loop on {dev} vs vmap on cpu",
                   worst <= tol, f"max|Δ| / max|x| <= {tol:g}", worst, tensors=len(ref))

    suite.guarded(c, f"BatchNorm ResNet-20 with augmentation, float64: vmap and loop on {dev} vs vmap on cpu",
                 "relative <= 1e-10", batch_norm)


def markdown(c: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    checks = c.get("checks", [])
    L += ["## Correctness", "", "| check | tolerance | max diff seen | passed |", "| --- | --- | --- | --- |"]
    for c in checks:
        L.append(f"| {c['name']} | {c['tolerance']} | {_f(c['max_diff'], 3)}"
                 f"{' (rel ' + _f(c['relative'], 3) + ')' if 'relative' in c else ''} | {'PASS' if c['passed'] else '**FAIL**'} |")
    L.append("")
    return L
