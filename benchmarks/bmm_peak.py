"""Peak of torch.bmm for the MLP 2NN's first layer, [R, B, 784] x [R, 784, 200]: how fast one
run's 10 rows and a group's 180 rows can go per FLOP on this machine (BENCHMARKS.md, "Many runs").

    python benchmarks/bmm_peak.py

Each shape: after waiting for a quiet machine, 3 warm-up calls, then the median of 20 timed calls (the load is
printed beside it).
"""

import harness
import torch


def main() -> None:
    a = harness.parser(__doc__).parse_args()
    for R, B in [(10, 100), (180, 100), (10, 10), (180, 10)]:
        x = torch.randn(R, B, 784)
        w = torch.randn(R, 784, 200)
        harness.wait_quiet()
        t = harness.measure(lambda x=x, w=w: torch.bmm(x, w), repeats=2 if a.quick else 20, warmup=3, quiet=False)
        dt = t.median
        print(f"bmm R={R} B={B}: {dt * 1e3:.2f} ms, {2 * R * B * 784 * 200 / dt / 1e9:.1f} GFLOPS (load {t.load_range()})")


if __name__ == "__main__":
    main()
