"""8. The personalized evaluation of every client against a per-client loop (``benchmarks/personal_eval.py``'s helpers)."""

from __future__ import annotations

import torch

from .common import _cap, _f, _status, peak_memory


def run(suite, e: dict) -> None:
    import personal_eval as pe

    cfg = suite.s.personal
    acc = "gpu" if suite.device.type == "cuda" else "cpu"
    e["job"] = (f"`benchmarks/personal_eval.py`'s evaluation: N clients of 20 training and 5 held-out examples of "
                f"{cfg['features']} features, MLP {cfg['hidden']}, Ditto's personal model set for every client: "
                "FederatedRun.personal_evaluation (vmapped, 256 clients a call) against a per-client loop "
                f"(functional_call per client), medians of {cfg['repeat']} taken in turn; the accuracies checked equal")

    def case(N):
        from lfed.engine.ranks import Ranks
        from lfed.personal.ditto import Ditto

        params = sum(a * b + b for a, b in zip([cfg["features"], *cfg["hidden"]], [*cfg["hidden"], 10]))
        placement = "host" if N * params * 4 > 2**31 else "device"
        dm = pe.synthetic(N, 20, 5, cfg["features"])
        m = pe.module(Ditto(lam=0.1), cfg["features"], cfg["hidden"], acc, evaluation={"personal_chunk": 256},
                      engine={"client_state": placement})
        pe.fit(m, dm, 1, acc)
        run = m.runs[0]
        clients = run.personal_sample()
        w = run.layout.module_vector(run.net)
        g = torch.Generator().manual_seed(1)
        for lo in range(0, clients.numel(), 256):
            c = clients[lo:lo + 256]
            m.objective.write_rows("personal", c, w + 0.01 * torch.randn(c.numel(), w.numel(), generator=g).to(w.device, w.dtype))
        evaluated = (run.client_accuracy(), None)

        def vmapped():
            return run.personal_evaluation(evaluated, Ranks(), lambda t: t, False, 2048)

        def row_of(k):
            return m.objective.rows("personal", torch.tensor([k], device=clients.device), first=w)[0]

        t_vmap, t_loop = pe.interleaved([vmapped, lambda: pe.one_by_one(run, clients, row_of)], cfg["repeat"])
        first = run.last_personal["personal"].clone()
        vmapped()
        repeatable = bool((run.last_personal["personal"] == first).all())
        agree = pe.agreement(run, clients, row_of, pe.one_by_one(run, clients, row_of), run.last_personal["personal"])
        agree["vmapped_repeatable"] = repeatable
        same = agree["equal"]
        if not agree["explained"]:
            raise AssertionError(f"the vmapped and the per-client evaluation disagree beyond float32 near-ties: {agree}")
        return {"steady_s_per_round": t_vmap, "vmapped_s": t_vmap, "loop_s": t_loop, "loop_over_vmapped": t_loop / t_vmap,
                "client_state": placement, "params": params, "accuracies_equal": same,
                "clients_differing_by_near_ties": agree["clients_differing"], **peak_memory(suite.device)}

    last = None
    for N in cfg["clients"]:
        est = None if last is None else last[1] * (N / last[0]) * (2 * cfg["repeat"] + 2) + 10
        c = suite.timed_case(e, {"name": f"personalized evaluation, N {N}", "N": N}, lambda N=N: case(N), est, reserve=False)
        if c["status"] == "ok":
            last = (N, c["loop_s"] + c["vmapped_s"])


def markdown(pe: dict) -> list[str]:
    """This section's part of gpu_suite.md."""
    L: list[str] = []
    if pe.get("cases"):
        L += ["## Personalized evaluation of every client against a per-client loop", "", _cap(pe.get("job", "")), "",
              "| case | status | vmapped s | loop s | loop / vmapped | client state "
              "| accuracies equal (else: clients differing, each at a float32 near tie) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        L += [f"| {c['name']} | {_status(c)} | {_f(c.get('vmapped_s'))} | {_f(c.get('loop_s'))} | {_f(c.get('loop_over_vmapped'), 3)} | "
              f"{_f(c.get('client_state'))} | "
              f"{'yes' if c.get('accuracies_equal') else _f(c.get('clients_differing_by_near_ties'))} |" for c in pe["cases"]]
        L.append("")
    return L
