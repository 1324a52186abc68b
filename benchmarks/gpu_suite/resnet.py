"""9. A BatchNorm ResNet's local training (issue 53)."""

from __future__ import annotations

import harness
import torch

from .common import _f, peak_memory, sync


def run(suite, r: dict) -> None:
    """One call of ``CohortTrainer.train``: K clients of random 3 x image x image inputs, ``steps`` local steps of
    ``batch``, the BatchNorm ResNet on the vmap backend (each client's running statistics its own row) against the
    loop backend and the centralized step (one net, the same steps over the cohort's K x batch examples at once),
    and vmap with ``crop_flip`` redrawn every step; medians of ``repeats`` after a warm-up call of each."""
    import resnet_round as rr  # its cohort and centralized calls (benchmarks/resnet_round.py, the CPU table)

    from lfed.models import ResNet18, ResNet20

    cfg, dev = suite.s.resnet, suite.device

    def make():
        torch.manual_seed(0)
        net = ResNet18() if cfg["model"] == "ResNet18" else ResNet20(width=4)
        return net.to(dev)

    k, n, steps, batch = cfg["cohort"], cfg["per_client"], cfg["steps"], cfg["batch"]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(k * n, 3, cfg["image"], cfg["image"], generator=g).to(dev)
    y = torch.randint(0, 10, (k * n,), generator=g).to(dev)
    index, sizes = torch.arange(k * n, device=dev).view(k, n), torch.full((k,), n, device=dev)
    r["job"] = (f"{cfg['model']} with BatchNorm, {k} clients of {n} random 3x{cfg['image']}x{cfg['image']} images, "
                f"{steps} local steps of batch {batch}: one CohortTrainer.train call; centralized = one net taking the same "
                f"steps over the cohort's {k} x {batch} examples at once; medians of {cfg['repeats']}")
    variants = {"lfed vmap": rr.lfed_call(make(), "vmap", x, y, index, sizes, steps, batch),
                "lfed loop": rr.lfed_call(make(), "loop", x, y, index, sizes, steps, batch),
                "centralized": rr.centralized_call(make(), x, y, index, steps, batch),
                "lfed vmap, crop_flip": rr.lfed_call(make(), "vmap", x, y, index, sizes, steps, batch, augment=True)}
    # a warm-up call of each, then interleaved; no waiting for a quiet CPU (the device's figures, the suite's budget)
    times = harness.interleave(variants, repeats=cfg["repeats"], warmup=1, quiet=False, sync=lambda: sync(dev))
    med = {name: t.median for name, t in times.items()}
    r["cases"] = [{"name": name, "s_per_call": med[name], "vs_centralized": med[name] / med["centralized"],
                   "vs_loop": med[name] / med["lfed loop"]} for name in variants]
    r.update(peak_memory(dev))


def markdown(rn: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if rn.get("cases"):
        L += ["## A BatchNorm ResNet's local training (issue 53)", "", rn.get("job", ""), "",
              "| variant | s per call | vs centralized | vs lfed loop |", "| --- | --- | --- | --- |"]
        L += [f"| {c['name']} | {_f(c['s_per_call'])} | {_f(c['vs_centralized'], 3)} | {_f(c['vs_loop'], 3)} |" for c in rn["cases"]]
        L.append("")
    return L
