"""Start-up of two lfed checkouts (``--before`` a 0.4 clone, ``--after`` this one), interleaved: `lfed --help`, `lfed fit --help`, and the
quickstart to its first round (1 round, no evaluation, W&B disabled). Median of 3 each, 1-minute load printed.

    python benchmarks/startup_before_after.py --before /tmp/v04 --after .

Each command in a fresh process with its checkout first on ``PYTHONPATH`` (its wall time, :mod:`harness`), the order
flipping every repeat, each started on a quiet machine.
"""
import os

import harness

CMDS = {
    "lfed --help": ["-m", "lfed", "--help"],
    "lfed fit --help": ["-m", "lfed", "fit", "--help"],
    "quickstart, 1 round": ["-m", "lfed", "fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps", "1",
                            "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false",
                            "--trainer.logger", "false", "--checkpoint_every", "0", "--trainer.default_root_dir", "/tmp/su"],
}


def main() -> None:
    ap = harness.parser(__doc__, repeats=3, description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout of the earlier version (git clone . /tmp/v04 && git -C /tmp/v04 checkout 2bff11a)")
    ap.add_argument("--after", default=".", help="this checkout")
    a = ap.parse_args()
    V = {"0.4": os.path.abspath(a.before), "0.5": os.path.abspath(a.after)}
    variants = {(v, c): harness.python(args, cwd=V[v], env={**os.environ, "PYTHONPATH": V[v], "WANDB_MODE": "disabled"})
                for c, args in CMDS.items() for v in V}

    def first_line(name, repeat, seconds, load, stdout) -> None:
        if name[1] == "lfed --help" and repeat == 0:
            print(name[0], name[1], "|", (stdout.splitlines() or [""])[0][:80])

    res = harness.interleave(variants, repeats=1 if a.quick else a.repeats, order="flip", log=first_line)
    for c in CMDS:
        x, y = res[("0.4", c)].median, res[("0.5", c)].median
        print(f"| {c} | {x:.2f} s | {y:.2f} s | {y / x:.2f} |")
    loads = harness.all_loads(res.values())
    print(f"loads at each start: {min(loads):.2f} to {max(loads):.2f}")


if __name__ == "__main__":
    main()
