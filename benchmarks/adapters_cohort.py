"""A cohort of LoRA adapters trained at once (lfed, vmap) against the same clients one after another (a peft loop).

Each of K clients holds B random character windows of the task's length (80) and takes ``--steps``
full-batch SGD steps on rank-r LoRA adapters (peft's layers; every linear layer of the blocks) over one
frozen lfed.models.zoo.CharTransformer base, starting from the same global adapters:

* ``lfed``: lfed's engine (``CohortTrainer``, backend ``vmap``, its default chunking) trains the K
  clients' adapters as one ``[K, P]`` computation over the base (the base read once per step);
* ``peft_loop``: one peft model (``get_peft_model``), the clients one after another: load the global
  adapters (``set_peft_model_state_dict``), ``--steps`` steps of ``torch.optim.SGD``, read the trained
  adapters (``get_peft_model_state_dict``). This is how FlowerTune's clients train (one peft model per
  client, one client at a time); building the model once and only swapping adapters favours the loop.

Both compute the same updates (``--check`` compares the clients' trained adapters). Every
(method, K) runs in its own process, so its peak memory is its own: peak RSS on the CPU
(``ru_maxrss``, the warm-up round included: lfed records its step there; also less the RSS once the
model and data are built), peak allocated CUDA memory on a GPU. ``--repeats`` (3) processes per
(K, method), interleaved (every (K, method) once per repeat), each after waiting for the 1-minute load
to fall below 1.0 (:mod:`harness`; the load is printed with each measurement). Prints one JSON
line per measurement (lfed's with the chunk its engine chose and one client's saved-tensor MB it chose
it from), then a table of medians with the ratio loop / variant (the speed-up). ``--chunks`` also times
lfed with fixed ``chunk_size`` values beside ``auto`` (the engine's choice, the headline): how the CPU
budget of ``lfed.engine.trainer`` was chosen. On a machine shared with other CPU-bound jobs, run with
``OMP_NUM_THREADS=1`` (README, Threads): with torch's spinning threads contended, a tiny smoke run here
took 1.16 s a round instead of 0.010 s.

    python benchmarks/adapters_cohort.py                       # K = 10, 50, 200 on the CPU
    python benchmarks/adapters_cohort.py --sizes 2 4 --d-model 16 --layers 1 --rounds 1 --repeats 1 --check   # a smoke run
    python benchmarks/adapters_cohort.py --sizes 16 --chunks 1 2 4 8 16 --methods lfed peft_loop --steps 2 --rounds 2
    python benchmarks/adapters_cohort.py --device cuda
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import resource
import statistics
import time

import harness
import torch
import torch.nn.functional as F

TARGET = ["blocks.*.attn.qkv", "blocks.*.attn.proj", "blocks.*.mlp.fc1", "blocks.*.mlp.fc2"]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def build(args, device):
    from lfed.models.zoo import CharTransformer

    torch.manual_seed(0)
    base = CharTransformer(vocab_size=80, seq_len=80, d_model=args.d_model, num_layers=args.layers,
                           num_heads=args.heads, d_ff=4 * args.d_model)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 80, (args.k * args.batch, 80), generator=g)
    y = torch.randint(0, 80, (args.k * args.batch,), generator=g)
    return base, x.to(device), y.to(device)


def run_lfed(args, device):
    from lfed.engine import CohortTrainer, StepRule
    from lfed.models.adapters import LoRA

    base, x, y = build(args, device)
    net = LoRA(base, rank=args.rank, alpha=2.0 * args.rank, target=TARGET).to(device)
    engine = CohortTrainer(net, backend="vmap", chunk_size=None if args.chunk == "auto" else int(args.chunk))
    w = engine.layout.module_vector(net)
    K, B = args.k, args.batch
    index = torch.arange(K * B, device=device).reshape(K, B)
    sizes = torch.full((K,), B, device=device)
    steps = torch.full((K,), args.steps)

    def round_():
        return engine.train(w, x, y, index, sizes, steps, StepRule(), args.lr, None, torch.Generator()).weights

    def chunk() -> dict:  # the chunk the engine chose, and one client's saved bytes it chose it from
        saved = next((v for v in engine._saved.values() if v), None)
        size = engine.chunk_size or engine._auto_chunk(K, "vmap", device, saved)
        return {"chunk": size, "saved_mb_per_client": None if saved is None else round(saved / 2**20, 2)}

    round_.chunk = chunk
    return round_, engine.layout.num_params


def run_peft_loop(args, device):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    base, x, y = build(args, device)
    names = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and any(fnmatch.fnmatchcase(n, p) for p in TARGET)]
    config = LoraConfig(r=args.rank, lora_alpha=2.0 * args.rank, lora_dropout=0.0, bias="none",
                        target_modules="^(?:" + "|".join(re.escape(n) for n in names) + ")$")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # lfed.models.adapters.LoRA's default seed: the same A
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
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    built = rss_mb()  # the model (base and adapters) and the data built: the rounds' memory is on top of this
    with harness.stopwatch(sync):
        round_()  # warm-up (lfed records its step here)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = harness.measure(round_, repeats=args.rounds, quiet=False, sync=sync)  # the caller waited for quiet
    result = times.results[-1]
    out = {"method": args.method, "K": args.k, "P": P, "seconds_per_round": sum(times.samples) / args.rounds,
           "rounds": args.rounds, "device": args.device, "threads": torch.get_num_threads(),
           "peak_rss_mb": round(peak_rss_mb(), 1), "peak_rss_over_built_mb": round(peak_rss_mb() - built, 1)}
    if hasattr(round_, "chunk"):
        out.update(round_.chunk())
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
    p = harness.parser(__doc__, repeats=3, description=__doc__.split("\n\n")[0])
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
    p.add_argument("--chunks", nargs="+", default=["auto"],
                   help="lfed's chunk_size: 'auto' (the engine's choice, the headline) and/or fixed sizes (to calibrate)")
    p.add_argument("--chunk", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.method is not None:  # a child process: one measurement
        harness.print_result(measure(args))
        return
    if args.quick:
        args.sizes, args.d_model, args.layers, args.heads, args.steps, args.rounds, args.repeats = [2], 16, 1, 2, 1, 1, 1
    variants = [(m, c) for m in args.methods for c in (args.chunks if m == "lfed" else ["-"])]

    def child(method: str, chunk: str, k: int):
        cmd = [__file__, "--method", method, "--k", str(k)] + [
            a for name in ("d_model", "layers", "heads", "rank", "batch", "steps", "lr", "rounds", "device")
            for a in (f"--{name.replace('_', '-')}", str(getattr(args, name)))] + (["--check"] if args.check else [])
        return harness.python(cmd + (["--chunk", chunk] if method == "lfed" else []))

    rows = []

    def log(key, r, _seconds, load, stdout) -> None:
        k, method, chunk = key
        row = harness.result_line(stdout)
        row.update(repeat=r, variant=method if method != "lfed" or chunk == "auto" else f"lfed/chunk={chunk}",
                   load_before=round(load, 2), load_after=round(harness.loadavg(), 2),
                   utc=time.strftime("%H:%M:%S", time.gmtime()))
        rows.append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "check"}), flush=True)

    # interleaved: every (K, method) once per repeat, each process started on a quiet machine
    harness.interleave({(k, m, c): child(m, c, k) for k in args.sizes for m, c in variants}, repeats=args.repeats, log=log)
    loads = [r["load_before"] for r in rows]
    print(f"\n{len(rows)} measurements, medians of {args.repeats}; load before each: {min(loads):.2f}-{max(loads):.2f}")
    mem = "peak_cuda_mb" if "peak_cuda_mb" in rows[0] else "peak_rss_mb"
    names = list(dict.fromkeys(r["variant"] for r in rows))
    print(f"{'K':>5} {'variant':>16} {'chunk':>6} {'s/round':>9} {'(min-max)':>15} {'peak MB':>9} {'loop/this':>9}")
    for k in args.sizes:
        med = {}
        for name in names:
            these = [r for r in rows if r["K"] == k and r["variant"] == name]
            med[name] = statistics.median(r["seconds_per_round"] for r in these)
        for name in names:
            these = [r for r in rows if r["K"] == k and r["variant"] == name]
            secs = [r["seconds_per_round"] for r in these]
            ratio = f"{med['peft_loop'] / med[name]:.2f}x" if "peft_loop" in med else "-"
            print(f"{k:>5} {name:>16} {str(these[0].get('chunk', '-')):>6} {med[name]:>9.3f} "
                  f"{f'({min(secs):.2f}-{max(secs):.2f})':>15} {statistics.median(r[mem] for r in these):>9.0f} {ratio:>9}")
        if args.check and "lfed" in med and "peft_loop" in med:
            a = next(r for r in rows if r["K"] == k and r["variant"] == "lfed")
            b = next(r for r in rows if r["K"] == k and r["variant"] == "peft_loop")
            wa, wb = torch.tensor(a["check"]["W"]), torch.tensor(b["check"]["W"])
            print(f"      check K={k}: client 0's adapters, lfed vs loop: max |diff| = {(wa - wb).abs().max():.2e} "
                  f"(of max |w| {wb.abs().max():.2e})")


if __name__ == "__main__":
    main()
