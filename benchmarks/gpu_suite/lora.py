"""7. A LoRA cohort against a peft loop (``benchmarks/adapters_cohort.py``'s ``measure``)."""

from __future__ import annotations

import math

import torch

from .common import Skipped, _cap, _f, _status, reset_peak


def run(suite, e: dict) -> None:
    import argparse as _argparse

    s = suite.s
    cfg = s.lora
    e["job"] = (f"`benchmarks/adapters_cohort.py` in this process: K clients x {cfg['steps']} full-batch SGD steps on "
                f"{cfg['batch']} random 80-character windows, rank-{cfg['rank']} LoRA on every linear layer of a "
                f"CharTransformer (d {cfg['d_model']}, {cfg['layers']} layers): lfed's engine (vmap) against one peft "
                f"model trained client after client; 1 warm-up round, {cfg['rounds']} timed")
    try:
        import peft  # noqa: F401
        reason = None
    except Exception as err:  # noqa: BLE001
        reason = f"peft not importable ({type(err).__name__}: {err})"
    last: dict[str, tuple[int, float]] = {}
    for k in cfg["sizes"]:
        for method in ("lfed", "peft_loop"):
            def one(method=method, k=k):
                if reason:
                    raise Skipped(reason)
                import adapters_cohort

                ns = _argparse.Namespace(method=method, k=k, d_model=cfg["d_model"], layers=cfg["layers"], heads=cfg["heads"],
                                         rank=cfg["rank"], batch=cfg["batch"], steps=cfg["steps"], lr=0.1,
                                         rounds=cfg["rounds"], device=str(suite.device), check=True, chunk="auto")
                reset_peak(suite.device)
                out = adapters_cohort.measure(ns)
                out["steady_s_per_round"] = out.pop("seconds_per_round")
                return out

            est = None
            if method in last:
                k0, sec = last[method]
                est = sec * (k / k0) * (cfg["rounds"] + 1) * 1.5 + 5
            case = suite.timed_case(e, {"name": f"{method}, K {k}", "method": method, "K": k}, one, est, reserve=False)
            if case["status"] == "ok":
                last[method] = (k, case["steady_s_per_round"])
        by = {c["method"]: c for c in e["cases"] if c.get("K") == k and c["status"] == "ok"}
        if len(by) == 2:
            a, b = torch.tensor(by["lfed"].pop("check")["W"]), torch.tensor(by["peft_loop"].pop("check")["W"])
            by["lfed"]["loop_over_lfed"] = by["peft_loop"]["steady_s_per_round"] / by["lfed"]["steady_s_per_round"]
            by["lfed"]["client0_max_abs_diff_vs_loop"] = float((a - b).abs().max()) if a.shape == b.shape else math.inf
            by["lfed"]["client0_max_abs_w"] = float(b.abs().max())
        for c in by.values():
            c.pop("check", None)
        suite.write()


def markdown(lo: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if lo.get("cases"):
        L += ["## LoRA cohort against a peft loop", "", _cap(lo.get("job", "")), "",
              "| case | status | s/round | loop / lfed | client 0 max abs diff vs loop | peak memory |", "| --- | --- | --- | --- | --- | --- |"]
        for c in lo["cases"]:
            mem = f"{c['peak_cuda_mb']:.0f} MB (device)" if "peak_cuda_mb" in c else (
                f"{c['peak_rss_mb']:.0f} MB (RSS, whole process)" if "peak_rss_mb" in c else "-")
            L.append(f"| {c['name']} | {_status(c)} | {_f(c.get('steady_s_per_round'))} | {_f(c.get('loop_over_lfed'), 3)} | "
                     f"{_f(c.get('client0_max_abs_diff_vs_loop'), 3)} | {mem} |")
        L.append("")
    return L
