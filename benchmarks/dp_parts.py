"""The parts of a DP-FedAvg round, each timed alone (median of 7): the norm pass, the weighted sum, the noise, ε.

    ../shared/tools/quiet-run python benchmarks/dp_parts.py

The cohort of benchmarks/dp_cost.py: 100 updates of the MLP 2NN (199,210 parameters), float32.
Prints the load average before and after.
"""

from __future__ import annotations

import harness
import torch

from lfed.privacy.accountant import _rdp_of_one_round, epsilon
from lfed.privacy.clipping import clip_factors


def main() -> None:
    a = harness.parser(__doc__, repeats=7).parse_args()
    n = 1 if a.quick else a.repeats
    print(f"load before {harness.loadavg():.2f}")
    u = torch.randn(100, 199210)
    g = torch.Generator().manual_seed(0)
    w = torch.full((100,), 0.01, dtype=torch.float64)
    harness.wait_quiet()

    def median_seconds(f, repeats: int = n) -> float:
        return harness.measure(f, repeats=repeats, quiet=False).median

    print("norm pass + clip factors:", median_seconds(lambda: clip_factors(torch.linalg.vector_norm(u, dim=1).double(), 0.5)))
    print("weighted sum (FedAvg's too):", median_seconds(lambda: w.float() @ u))
    print("randn(P):", median_seconds(lambda: torch.randn(199210, generator=g)))
    print("epsilon, cached RDP:", median_seconds(lambda: epsilon({(0.1, 1.0): 50}, 1e-5)))
    print("RDP of a round from scratch:",
          median_seconds(lambda: (_rdp_of_one_round.cache_clear(), epsilon({(0.1, 1.0): 50}, 1e-5)), min(n, 3)))
    print(f"load after {harness.loadavg():.2f}")


if __name__ == "__main__":
    main()
