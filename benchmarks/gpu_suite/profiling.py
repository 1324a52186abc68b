"""5. A ``torch.profiler`` summary of one lfed vmap round."""

from __future__ import annotations

import math

import harness

from .common import sync, trainer_for


def run(suite, p: dict) -> None:
    from lightning.pytorch import Callback
    from torch.profiler import ProfilerActivity, profile

    s, dev = suite.s, suite.device
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    holder: dict = {}
    target = s.warmup + 1  # the round after the warm-up (1-based)

    class Prof(Callback):
        def on_train_batch_start(self, trainer, *a) -> None:
            if trainer.global_step + 1 == target:
                sync(dev)
                holder["prof"] = profile(activities=acts)
                holder["prof"].__enter__()
                holder["t"] = harness.clock()

        def on_train_batch_end(self, trainer, *a) -> None:
            if "t" in holder and "wall" not in holder:
                sync(dev)
                holder["wall"] = harness.clock() - holder["t"]
                holder["prof"].__exit__(None, None, None)

    m = suite.pfl_module("vmap", s.profile_cohort)
    trainer_for(dev, target, "32-true", callbacks=[Prof()]).fit(m, datamodule=suite.pfl_data()())
    prof, wall = holder["prof"], holder["wall"]
    steps = math.ceil(s.images_per_client / s.batch_size)
    events = prof.key_averages()

    def dev_self(e):
        for name in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(e, name):
                return float(getattr(e, name))
        return 0.0

    from torch.autograd import DeviceType

    kernels = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA]  # the kernels' own rows
    kernel_us = sum(dev_self(e) for e in kernels) if dev.type == "cuda" else None
    launches = sum(e.count for e in events if "LaunchKernel" in e.key)
    ops = [e for e in events if getattr(e, "device_type", None) != DeviceType.CUDA]
    cpu_ops_us = sum(e.self_cpu_time_total for e in ops if e.key.startswith("aten::"))
    key = lambda e: float(e.self_cpu_time_total)  # noqa: E731
    top = sorted(ops, key=key, reverse=True)[:12]
    p["top_kernels"] = [{"kernel": e.key[:120], "count": e.count, "device_ms": dev_self(e) / 1e3}
                        for e in sorted(kernels, key=dev_self, reverse=True)[:12]]
    p["cohort"], p["local_steps"], p["round_wall_s"] = s.profile_cohort, steps, wall
    p["per_step_wall_ms"] = wall * 1e3 / steps
    if kernel_us is not None:
        p["kernel_s"] = kernel_us / 1e6
        p["per_step_kernel_ms"] = kernel_us / 1e3 / steps
        p["per_step_overhead_ms"] = (wall * 1e6 - kernel_us) / 1e3 / steps
        p["kernel_fraction"] = kernel_us / 1e6 / wall
    p["kernel_launches"] = launches
    p["aten_self_cpu_s"] = cpu_ops_us / 1e6
    p["top_ops"] = [{"op": e.key, "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                     "self_device_ms": dev_self(e) / 1e3} for e in top]


def markdown(p: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if p.get("status") == "ok":
        L += ["## Profile of one lfed vmap round", "",
              f"Cohort {p['cohort']}, {p['local_steps']} local steps; round {p['round_wall_s'] * 1e3:.1f} ms wall, "
              f"{p['per_step_wall_ms']:.2f} ms per local step"
              + (f"; kernels {p['per_step_kernel_ms']:.2f} ms per step, launch + Python overhead {p['per_step_overhead_ms']:.2f} ms "
                 f"per step (kernel fraction {p['kernel_fraction']:.2f})" if "kernel_s" in p else "")
              + f"; {p['kernel_launches']} kernel launches; aten ops' self CPU time {p['aten_self_cpu_s'] * 1e3:.1f} ms. "
              "Top ops by self CPU time:", "",
              "| op | calls | self CPU ms | self device ms |", "| --- | --- | --- | --- |"]
        L += [f"| `{o['op'][:60]}` | {o['count']} | {o['self_cpu_ms']:.3f} | {o['self_device_ms']:.3f} |" for o in p["top_ops"]]
        if p.get("top_kernels"):
            L += ["", "Top kernels by device time:", "", "| kernel | calls | device ms |", "| --- | --- | --- |"]
            L += [f"| `{k['kernel'][:70].replace('|', '/')}` | {k['count']} | {k['device_ms']:.3f} |" for k in p["top_kernels"]]
        L.append("")
    return L
