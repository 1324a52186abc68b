"""Start-up of two lfed checkouts (``--before`` a 0.4 clone, ``--after`` this one), interleaved: `lfed --help`, `lfed fit --help`, and the
quickstart to its first round (1 round, no evaluation, W&B disabled). Median of 3 each, 1-minute load printed."""
import argparse
import os
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--before", required=True, help="a checkout of the earlier version (git clone . /tmp/v04 && git -C /tmp/v04 checkout 2bff11a)")
ap.add_argument("--after", default=".", help="this checkout")
a = ap.parse_args()
V = {"0.4": os.path.abspath(a.before), "0.5": os.path.abspath(a.after)}
CMDS = {
    "lfed --help": ["-m", "lfed", "--help"],
    "lfed fit --help": ["-m", "lfed", "fit", "--help"],
    "quickstart, 1 round": ["-m", "lfed", "fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps", "1",
                            "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false",
                            "--trainer.logger", "false", "--checkpoint_every", "0", "--trainer.default_root_dir", "/tmp/su"],
}
res = {(v, c): [] for v in V for c in CMDS}
loads = []
for rep in range(3):
    for c, args in CMDS.items():
        for v in (V if rep % 2 == 0 else dict(reversed(list(V.items())))):
            while os.getloadavg()[0] > 1.0:
                time.sleep(5)
            loads.append(os.getloadavg()[0])
            env = {**os.environ, "PYTHONPATH": V[v], "WANDB_MODE": "disabled"}
            t = time.perf_counter()
            p = subprocess.run([sys.executable, *args], cwd=V[v], env=env, capture_output=True, text=True)
            res[(v, c)].append(time.perf_counter() - t)
            if c == "lfed --help" and rep == 0:
                print(v, c, "rc", p.returncode, "|", (p.stdout or p.stderr).splitlines()[0][:80])
for c in CMDS:
    x, y = statistics.median(res[("0.4", c)]), statistics.median(res[("0.5", c)])
    print(f"| {c} | {x:.2f} s | {y:.2f} s | {y / x:.2f} |")
print(f"loads at each start: {min(loads):.2f} to {max(loads):.2f}")
