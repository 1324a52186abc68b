"""A cohort of LoRA adapters trained at once (lfed, vmap) against the same clients one after another (a peft loop).

Each of K clients holds B random character windows of the task's length (80) and takes ``--steps``
full-batch SGD steps on rank-r LoRA adapters (peft's layers; every linear layer of the blocks) over one
frozen lfed.models.CharTransformer base, starting from the same global adapters:

* ``lfed``: lfed's engine (``CohortTrainer``, backend ``vmap``, its default chunking) trains the K
  clients' adapters as one ``[K, P]`` computation over the base (the base read once per step);
* ``peft_loop``: one peft model (``get_peft_model``), the clients one after another: load the global
  adapters (``set_peft_model_state_dict``), ``--steps`` steps of ``torch.optim.SGD``, read the trained
  adapters (``get_peft_model_state_dict``). This is how FlowerTune's clients train (one peft model per
  client, one client at a time); building the model once and only swapping adapters favours the loop.

Both compute the same updates (``--check`` compares the clients' trained adapters). Every
(method, K) runs in its own process, so its peak memory is its own: peak RSS on the CPU
(``ru_maxrss``; also less the RSS once the model and data are built), peak allocated CUDA memory on a
GPU. Prints one JSON line per measurement, then a table with the ratio loop / lfed (the speed-up).
On a machine shared with other CPU-bound jobs, run with ``OMP_NUM_THREADS=1`` (README, Threads): with
torch's spinning threads contended, a tiny smoke run here took 1.16 s a round instead of 0.010 s.

    python benchmarks/adapters_cohort.py                       # K = 10, 50, 200 on the CPU
    python benchmarks/adapters_cohort.py --sizes 2 4 --d-model 16 --layers 1 --rounds 1 --check   # a smoke run
    python benchmarks/adapters_cohort.py --device cuda
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

TARGET = ["blocks.*.attn.qkv", "blocks.*.attn.proj", "blocks.*.mlp.fc1", "blocks.*.mlp.fc2"]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def build(args, device):
    from lfed.models import CharTransformer

    torch.manual_seed(0)
    base = CharTransformer(vocab_size=80, seq_len=80, d_model=args.d_model, num_layers=args.layers,
                           num_heads=args.heads, d_ff=4 * args.d_model)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 80, (args.k * args.batch, 80), generator=g)
    y = torch.randint(0, 80, (args.k * args.batch,), generator=g)
    return base, x.to(device), y.to(device)


def run_lfed(args, device):
    from lfed.adapters import LoRA
    from lfed.engine import CohortTrainer, StepRule

    base, x, y = build(args, device)
    net = LoRA(base, rank=args.rank, alpha=2.0 * args.rank, target=TARGET).to(device)
    engine = CohortTrainer(net, backend="vmap")
    w = engine.layout.module_vector(net)
    K, B = args.k, args.batch
    index = torch.arange(K * B, device=device).reshape(K, B)
    sizes = torch.full((K,), B, device=device)
    steps = torch.full((K,), args.steps)

    def round_():
        return engine.train(w, x, y, index, sizes, steps, StepRule(), args.lr, None, torch.Generator()).weights

    return round_, engine.layout.num_params


def run_peft_loop(args, device):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    base, x, y = build(args, device)
    names = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and any(fnmatch.fnmatchcase(n, p) for p in TARGET)]
    config = LoraConfig(r=args.rank, lora_alpha=2.0 * args.rank, lora_dropout=0.0, bias="none",
                        target_modules="^(?:" + "|".join(re.escape(n) for n in names) + ")$")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # lfed.adapters.LoRA's default seed: the same A
        model = get_peft_model(base, config).to(device)
    start = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    K, B = args.k, args.batch
    P = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def round_():
        out = []
        for k in range(K):
            set_peft_model_state_dict(model, start)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.SGD(params, lr=args.lr)
            xb, yb = x[k * B : (k + 1) * B], y[k * B : (k + 1) * B]
            for _ in range(args.steps):
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            out.append({n: v.detach().clone() for n, v in get_peft_model_state_dict(model).items()})
        return out

    return round_, P


def measure(args) -> dict:
    device = torch.device(args.device)
    fn = {"lfed": run_lfed, "peft_loop": run_peft_loop}[args.method]
    round_, P = fn(args, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    built = rss_mb()  # the model (base and adapters) and the data built: the rounds' memory is on top of this
    result = round_()  # warm-up (lfed records its step here)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        result = round_()
        sync()
        times.append(time.perf_counter() - t)
    out = {"method": args.method, "K": args.k, "P": P, "seconds_per_round": sum(times) / len(times),
           "rounds": args.rounds, "device": args.device, "threads": torch.get_num_threads(),
           "peak_rss_mb": round(peak_rss_mb(), 1), "peak_rss_over_built_mb": round(peak_rss_mb() - built, 1)}
    if device.type == "cuda":
        out["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    if args.check:
        out["check"] = first_client(result, args.method)
    return out


def first_client(result, method) -> dict[str, list[float]]:
    """Client 0's trained adapters as one flat list, for --check (both in module order: each layer's A, then its B)."""
    if method == "lfed":
        return {"W": result[0].tolist()}
    return {"W": torch.cat([v.reshape(-1) for v in result[0].values()]).tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 200], help="cohort sizes K")
    p.add_argument("--methods", nargs="+", default=["lfed", "peft_loop"])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="examples per client (one full-batch step each)")
    p.add_argument("--steps", type=int, default=5, help="local steps per client")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--check", action="store_true", help="compare client 0's trained adapters of the two methods")
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.method is not None:  # a child process: one measurement
        print(json.dumps(measure(args)))
        return
    rows = []
    for k in args.sizes:
        for method in args.methods:
            cmd = [sys.executable, __file__, "--method", method, "--k", str(k)] + [
                a for name in ("d_model", "layers", "heads", "rank", "batch", "steps", "lr", "rounds", "device")
                for a in (f"--{name.replace('_', '-')}", str(getattr(args, name)))] + (["--check"] if args.check else [])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{method} K={k} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "check"}), flush=True)
    print(f"\n{'K':>5} {'P':>8} {'lfed s/round':>13} {'loop s/round':>13} {'speed-up':>9} {'lfed peak MB':>13} {'loop peak MB':>13}")
    for k in args.sizes:
        by = {r["method"]: r for r in rows if r["K"] == k}
        if {"lfed", "peft_loop"} <= set(by):
            a, b = by["lfed"], by["peft_loop"]
            mem = "peak_cuda_mb" if "peak_cuda_mb" in a else "peak_rss_mb"
            print(f"{k:>5} {a['P']:>8} {a['seconds_per_round']:>13.3f} {b['seconds_per_round']:>13.3f} "
                  f"{b['seconds_per_round'] / a['seconds_per_round']:>8.2f}x {a[mem]:>13.1f} {b[mem]:>13.1f}")
            if args.check:
                wa, wb = torch.tensor(a["check"]["W"]), torch.tensor(b["check"]["W"])
                print(f"      check K={k}: client 0's adapters, lfed vs loop: max |diff| = {(wa - wb).abs().max():.2e} "
                      f"(of max |w| {wb.abs().max():.2e})")


if __name__ == "__main__":
    main()
