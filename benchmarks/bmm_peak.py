"""Peak of torch.bmm for the MLP 2NN's first layer, [R, B, 784] x [R, 784, 200]: how fast one
run's 10 rows and a group's 180 rows can go per FLOP on this machine (BENCHMARKS.md, "Many runs").

    python benchmarks/bmm_peak.py
"""

import time

import torch

for R, B in [(10, 100), (180, 100), (10, 10), (180, 10)]:
    x = torch.randn(R, B, 784)
    w = torch.randn(R, 784, 200)
    for _ in range(3):
        torch.bmm(x, w)
    t = time.perf_counter()
    n = 20
    for _ in range(n):
        torch.bmm(x, w)
    dt = (time.perf_counter() - t) / n
    print(f"bmm R={R} B={B}: {dt * 1e3:.2f} ms, {2 * R * B * 784 * 200 / dt / 1e9:.1f} GFLOPS")
