"""5. The vmapped local step eager / recorded (lfed's ``make_fx`` replay) / ``torch.compile``-d / replayed as a CUDA graph."""

from __future__ import annotations

import traceback

import harness
import torch

from .common import PflCNN, _f, diff, sync


def run(suite, c: dict) -> None:
    from lfed.engine import CohortTrainer

    s, dev = suite.s, suite.device
    K, B = s.profile_cohort, s.batch_size
    torch.manual_seed(0)
    net = PflCNN(image_size=s.image_size, dropout=False).to(dev)  # no dropout: outputs comparable bit for bit
    tr = CohortTrainer(net, backend="vmap")
    g = torch.Generator().manual_seed(1)
    W = (tr.layout.module_vector(net).detach().cpu()[None] + 0.01 * torch.randn(K, tr.layout.num_params, generator=g)).to(dev)

    def inputs(seed):
        gg = torch.Generator().manual_seed(seed)
        x = torch.rand(K, B, 3, s.image_size, s.image_size, generator=gg).to(dev)
        y = torch.randint(0, 10, (K, B), generator=gg).to(dev)
        return tr.layout.unflatten(W.clone()), x, y, torch.ones(K, B, device=dev), {}

    def leaves(out):
        gr, loss = out
        return torch.cat([v.reshape(K, -1) for v in gr.values()] + [loss.reshape(K, 1)], 1)

    def timeit(fn, args):
        return harness.measure(lambda: fn(*args), repeats=s.step_reps, quiet=False, sync=lambda: sync(dev)).median

    args = inputs(2)
    ref = leaves(tr._vmapped(*args))
    variants = []
    eager_ms = timeit(tr._vmapped, args) * 1e3
    variants.append({"variant": "eager vmap(grad)", "ms": eager_ms, "max_diff": 0.0, "exact": True})
    tr._step(*args, whole=True)  # records
    recorded = next((fn for fn in tr._traced.values() if fn is not None), None)
    rec_ms = None
    if recorded is None:
        variants.append({"variant": "recorded (make_fx)", "status": "not recorded (lfed runs this step eagerly)"})
    else:
        out = leaves(recorded(*args))
        rec_ms = timeit(recorded, args) * 1e3
        variants.append({"variant": "recorded (make_fx)", "ms": rec_ms, "max_diff": diff(out, ref)[0],
                         "exact": bool(torch.equal(out, ref))})
    base = rec_ms or eager_ms

    def attempt(name, build):
        row = {"variant": name}
        try:
            with harness.stopwatch(lambda: sync(dev)) as sw:
                fn = build()
                out = leaves(fn(*args))  # compiles / captures
            row["build_s"] = sw.seconds
            row["ms"] = timeit(fn, args) * 1e3
            row["max_diff"], row["relative"] = diff(out, ref)
            row["exact"] = bool(torch.equal(out, ref))
            # a second input set: the same function on other data
            args2 = inputs(3)
            out2, ref2 = leaves(fn(*args2)), leaves(tr._vmapped(*args2))
            row["max_diff_other_inputs"] = diff(out2, ref2)[0]
            row["exact"] = row["exact"] and bool(torch.equal(out2, ref2))
            row["speedup_vs_lfed_step"] = base / row["ms"]
            row["keep"] = row["exact"] and row["ms"] < base * 0.95
            row["status"] = "ok"
        except Exception:  # noqa: BLE001
            row["status"] = "error"
            row["error"] = traceback.format_exc()
        variants.append(row)
        suite.write()

    if suite.budget_left() + s.reserve_s > 0:
        backend = suite.args.compile_backend or s.compile_backend
        torch._dynamo.reset()
        attempt(f"torch.compile(vmapped step, backend={backend})",
                lambda: torch.compile(lambda *a: tr._vmapped(*a), backend=backend, dynamic=False))
    else:
        variants.append({"variant": "torch.compile", "status": "skipped", "reason": "time budget"})
    if dev.type != "cuda":
        variants.append({"variant": "CUDA graph of the recorded step", "status": "skipped", "reason": "needs CUDA"})
    elif recorded is None:
        variants.append({"variant": "CUDA graph of the recorded step", "status": "skipped", "reason": "no recorded step"})
    else:
        def graphed():
            static = inputs(2)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    recorded(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = recorded(*static)

            def run(params, x, y, mask, buffers):
                for k in params:
                    static[0][k].copy_(params[k])
                static[1].copy_(x)
                static[2].copy_(y)
                static[3].copy_(mask)
                graph.replay()
                return static_out

            return run

        attempt("CUDA graph of the recorded step (inputs copied in)", graphed)
    c["cohort"], c["batch"], c["variants"] = K, B, variants
    c["baseline"] = "lfed's recorded step" if rec_ms else "eager step"


def markdown(cg: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if cg.get("variants"):
        L += ["## The vmapped local step: eager, recorded, torch.compile, CUDA graph", "",
              f"Cohort {cg['cohort']}, batch {cg['batch']}, pfl CNN without dropout; baseline {cg['baseline']}; keep = exact "
              "on two input sets and >5% faster.", "",
              "| variant | status | ms/step | build s | max diff | exact | speed-up | keep |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for v in cg["variants"]:
            status = v.get("status", "ok")
            if status == "skipped":
                status = f"skipped: {v.get('reason')}"
            elif status == "error":
                status = "ERROR: " + v["error"].strip().splitlines()[-1][:80].replace("|", "/")
            L.append(f"| {v['variant']} | {status} | {_f(v.get('ms'))} | {_f(v.get('build_s'), 3)} | {_f(v.get('max_diff'), 3)} | "
                     f"{_f(v.get('exact'))} | {_f(v.get('speedup_vs_lfed_step'), 3)} | {_f(v.get('keep'))} |")
        L.append("")
    return L
