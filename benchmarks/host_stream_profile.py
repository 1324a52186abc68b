"""Do the host rows' copies overlap the evaluation's kernels? (issue 39: the host-row stream at N = 10,000)

    python benchmarks/host_stream_profile.py --device cuda --clients 10000          # on a GPU
    python benchmarks/host_stream_profile.py --device cpu --clients 300 --features 16  # the code path, on the CPU

Builds ``benchmarks/personal_eval.py``'s Ditto case (N clients of 20 training and 5 held-out examples, the
MLP of ``--hidden``, every client's personal model set) with its per-client rows in host memory
(``client_state="host"``: pinned on CUDA, copied in ``personal_chunk``-client blocks through two alternating
buffers), runs one vmapped personalized evaluation as a warm-up, then one under ``torch.profiler`` and reads the
device's timeline: the union of the kernels' intervals (compute busy), of the host-to-device copies' intervals
(copy busy), their intersection (overlapped), and the evaluation's wall time. With perfect overlap the wall is
about ``max(compute, copy)``; with none, ``compute + copy``. Prints one JSON line (and writes ``--out``).
"""

from __future__ import annotations

import json
from pathlib import Path

import harness
import personal_eval as pe
import torch


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def intersection(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def main() -> None:
    ap = harness.parser(__doc__, repeats=3, out=None, out_help="also write the JSON row here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--hidden", type=int, nargs="+", default=[200, 200])
    ap.add_argument("--chunk", type=int, default=256)
    a = ap.parse_args()
    if a.quick:
        a.device, a.clients, a.features, a.hidden, a.repeats = "cpu", 20, 8, [8], 1
    from torch.profiler import ProfilerActivity, profile

    from lfed.engine.ranks import Ranks
    from lfed.personal.ditto import Ditto

    acc = "gpu" if a.device == "cuda" else "cpu"
    dm = pe.synthetic(a.clients, 20, 5, a.features)
    m = pe.module(Ditto(lam=0.1), a.features, a.hidden, acc, evaluation={"personal_chunk": a.chunk},
                  engine={"client_state": "host"})
    pe.fit(m, dm, 1, acc)
    run = m.runs[0]
    clients = run.personal_sample()
    w = run.layout.module_vector(run.net)
    g = torch.Generator().manual_seed(1)
    for lo in range(0, clients.numel(), a.chunk):
        c = clients[lo:lo + a.chunk]
        m.objective.write_rows("personal", c, w + 0.01 * torch.randn(c.numel(), w.numel(), generator=g).to(w.device, w.dtype))
    evaluated = (run.client_accuracy(), None)

    def evaluate():
        return run.personal_evaluation(evaluated, Ranks(), lambda t: t, False, 2048)

    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    plain = harness.measure(evaluate, repeats=a.repeats, warmup=1, sync=sync)  # on a quiet machine, after a warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof, harness.stopwatch(sync) as sw:
        evaluate()
    wall = sw.seconds
    kernels, copies = [], []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        iv = (e.time_range.start, e.time_range.end)  # microseconds
        name = e.name.lower()
        if "memcpy" in name:
            if "htod" in name or "host to device" in name or "h2d" in name:
                copies.append(iv)
        elif "memset" not in name:
            kernels.append(iv)
    k, c = union(kernels), union(copies)
    row = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "clients": a.clients,
           "params": int(w.numel()), "chunk": a.chunk, "row_bytes_total": a.clients * int(w.numel()) * 4,
           "plain_s": sorted(plain.samples), "profiled_wall_s": wall, "kernel_busy_s": length(k) / 1e6, "h2d_copy_busy_s": length(c) / 1e6,
           "overlap_s": intersection(k, c) / 1e6, "kernel_events": len(kernels), "copy_events": len(copies),
           "load": plain.loads}
    if row["h2d_copy_busy_s"] > 0:
        row["h2d_GBps"] = row["row_bytes_total"] / row["h2d_copy_busy_s"] / 1e9
        row["overlap_of_copy"] = row["overlap_s"] / row["h2d_copy_busy_s"]
    print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
