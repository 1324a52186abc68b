"""CPU milliseconds of one trace-driven cohort draw (``AvailableSampler.sample``, issue 65) at N clients following the
shipped 32-row trace (``configs/traces/synthetic_behave.json``), K = 100: the median of 8 rounds, the clock moved 37
simulated seconds between them. Run it below load 1.0 with each version first on ``PYTHONPATH``, interleaved:

    for i in 1 2 3; do for v in <before> .; do PYTHONPATH=$v ../shared/tools/quiet-run python benchmarks/trace_sample.py; done; done
"""

import os
import sys
import time
from pathlib import Path

import torch

from lfed.participation.availability import AvailableSampler
from lfed.participation.clock import SimulatedClock
from lfed.state.spec import ModuleStateStore

TRACE = Path(__file__).resolve().parents[1] / "configs" / "traces" / "synthetic_behave.json"

for N in [int(v) for v in sys.argv[1:]] or (10**3, 10**6):
    clock = SimulatedClock("constant", time_per_step=12.5, trace=str(TRACE))
    sampler = AvailableSampler(clock)
    sampler.seed = 0
    sampler.setup_state(ModuleStateStore(), torch.ones(N, dtype=torch.long), 10, torch.zeros(1))
    g = torch.Generator().manual_seed(0)
    times = []
    for r in range(8):
        t = time.process_time()
        sampler.sample(r, 100, g)
        times.append(time.process_time() - t)
        clock.now += 37.0
    times.sort()
    print(f"N={N}: sample {times[4] * 1000:.2f} ms (median of 8), load {os.getloadavg()[0]:.2f}")
