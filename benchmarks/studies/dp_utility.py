"""DP-FedAvg's privacy-utility curve from the protocol study ``configs/paper/grids/dp_utility_mnist.yaml``.

Reads the study's results (``benchmarks/results/protocol/dp_utility_mnist.json``, written by
``benchmarks/studies/paper_protocol.py``), draws test accuracy against ε (mean ± std over seeds; ε = ∞, the same
clipping with no noise, at the right) to ``benchmarks/results/protocol/dp_utility_mnist_eps.png`` and prints
the table of RESULTS.md: per ε the calibrated noise multiplier z, the ε spent after the last round (the
largest over seeds), the chosen client lr and the test accuracy.

    python benchmarks/studies/dp_utility.py
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
RESULTS = BENCH / "results" / "protocol" / "dp_utility_mnist.json"


def main() -> None:
    res = json.loads(RESULTS.read_text())
    rows = []
    for name, r in res.items():
        target = math.inf if "∞" in name else float(name.split("=")[1])
        accs = [100 * s["test_last10"] for s in r["seeds"]]
        spent = [s["extra"].get("privacy/epsilon_max", math.nan) for s in r["seeds"]]
        z = [s["extra"].get("privacy/noise_multiplier_mean", math.nan) for s in r["seeds"]]
        clip = [s["extra"].get("privacy/clip_last10pct", math.nan) for s in r["seeds"]]
        rows.append((target, name, r["point"], accs, max(spent), statistics.mean(z), statistics.mean(clip)))
    rows.sort(key=lambda x: -x[0])
    print("| target ε (δ = 1/N) | noise multiplier z | ε spent after the last round | chosen client lr | clip C, last 10% | "
          "test acc, last 10% (%) mean ± std | seeds |")
    print("|---|---|---|---|---|---|---|")
    for target, _name, point, accs, spent, z, clip in rows:
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        lr = ", ".join(f"{v:g}" for v in point.values()) if isinstance(point, dict) else str(point)
        print(f"| {'∞' if math.isinf(target) else f'{target:g}'} | {z:.3f} | {'∞' if math.isinf(spent) else f'{spent:.3f}'} | "
              f"{lr} | {clip:.3g} | {statistics.mean(accs):.2f} ± {sd:.2f} | {len(accs)} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [r for r in rows if not math.isinf(r[0])]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    xs = [r[0] for r in finite]
    ax.errorbar(xs, [statistics.mean(r[3]) for r in finite], yerr=[statistics.stdev(r[3]) if len(r[3]) > 1 else 0 for r in finite],
                marker="o", capsize=3, label="DP-FedAvg (σ calibrated per ε)")
    for r in rows:
        if math.isinf(r[0]):
            ax.axhline(statistics.mean(r[3]), color="gray", ls="--", label="ε = ∞ (clipping, no noise)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel("ε at δ = 1/N (100 rounds)")
    ax.set_ylabel("test accuracy, last 10% of rounds (%)")
    ax.set_title("MNIST, 6,000 clients, Poisson q = 0.02, MLP 784-100-10", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS.with_name("dp_utility_mnist_eps.png")
    fig.savefig(out, dpi=120)
    print(f"\n![accuracy against ε]({out.relative_to(BENCH.parent)})")


if __name__ == "__main__":
    main()
