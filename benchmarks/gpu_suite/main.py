"""The command line: ``python benchmarks/gpu_suite.py ...``."""

from __future__ import annotations

import sys

import harness
import torch

from . import __doc__ as DOC
from .suite import SECTIONS as ALL
from .suite import Suite

SECTIONS = tuple(name for name in ALL if name != "environment")  # environment always runs


def main(argv=None) -> int:
    ap = harness.parser(DOC, out=None, out_help="output folder (gpu_suite.json, gpu_suite.md); required")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--budget-s", type=float, default=None, help="whole-run time budget (default 480 s; --quick 120 s)")
    ap.add_argument("--case-cap-s", type=float, default=None, help="stop timing a case after this many timed seconds "
                    "(at least 3 timed rounds; default 20 s)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; --quick aot_eager)")
    ap.add_argument("--sections", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
                    help="only these sections, comma-separated (environment always runs): " + ", ".join(SECTIONS))
    ap.add_argument("--cohorts", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="the timing section's cohorts, comma-separated (default 50,200,1000; --quick 2,4)")
    args = ap.parse_args(argv)
    if not args.out:
        ap.error("--out is required")
    unknown = sorted(set(args.sections or []) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: {', '.join(unknown)} not among {', '.join(SECTIONS)}")
    if args.budget_s is None:
        args.budget_s = 120.0 if args.quick else 480.0
    if args.case_cap_s is None:
        args.case_cap_s = 20.0
    from lfed.lightning.reporting import silence_library_noise

    silence_library_noise()
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    from lfed.core.registry import CompositionWarning

    warnings.filterwarnings("ignore", category=CompositionWarning)  # short test runs (few participations) are meant
    return Suite(args).run()


if __name__ == "__main__":
    sys.exit(main())
