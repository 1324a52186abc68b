"""gpu_suite.md from the suite's result: a header, then each section's own table (its module's ``markdown``), in order."""

from __future__ import annotations

from . import compile_graphs, correctness, dp_sgd, environment, host_sync, lora, personal, precision, profiling, resnet, set_up, timing

#: The order of the tables in gpu_suite.md: section name -> its module.
TABLES = {"environment": environment, "correctness": correctness, "timing": timing, "resnet": resnet, "dp_sgd": dp_sgd,
          "setup": set_up, "host_sync": host_sync, "precision": precision, "lora": lora, "personal_eval": personal,
          "profile": profiling, "compile_graphs": compile_graphs}


def markdown(r: dict) -> str:
    secs = r["sections"]
    L = [f"# lfed GPU suite: {r['device']}{' (--quick)' if r['quick'] else ''}", "",
         f"Elapsed {r.get('elapsed_s', 0):.1f} s, exit status {r.get('exit_status')}.", ""]
    for name, sec in secs.items():
        if sec.get("status") == "error":
            L += [f"**Section {name} raised** (traceback in gpu_suite.json):", "", "```", sec["error"].strip().splitlines()[-1], "```", ""]
    for name, module in TABLES.items():
        L += module.markdown(secs.get(name, {}))
    return "\n".join(L)
