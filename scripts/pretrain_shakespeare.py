"""Pretrain lfed's CharTransformer centrally on the Shakespeare roles that are not clients (the public share).

The federated run (configs/lora_shakespeare.yaml) partitions LEAF Shakespeare naturally, one client per
speaking role, keeping the first ``--clients`` roles (``lfed.data.partition.natural_partition``: roles in
ascending id order). The other roles' text never reaches a client: this script trains the base on their
training examples, at every position (inputs ``x [n, 80]``, targets ``x[:, 1:]`` then ``y``), with AdamW,
and evaluates next-character accuracy and perplexity ``exp(mean NLL)`` on their test examples.

With ``--val-fraction f`` it holds out whole passages of the public text, about ``f`` of its windows
(:func:`passage_holdout`), and keeps the epoch whose NLL (every position) is lowest on them. LEAF's test
windows of the public role in shared/data are single windows drawn from inside its text (every one shares
79 characters with a training window), so the plain test figures measure memorization, and a base trained to
the end memorizes the public role: it is confidently wrong on the clients' roles (RESULTS.md, the Shakespeare
studies).

It works in chunks of at most ``--minutes`` (a shared machine): the training state is kept in
``<out>.train.pt`` and the next call continues it exactly (same batches, same optimizer state). When
all ``--epochs`` are done it writes ``<out>`` (``torch.save(model.state_dict())``, what
``lfed.models.adapters.LoRA(base_checkpoint=...)`` loads) and ``<out>.json`` (settings and metrics).

    LFED_DATA_DIR=/path/to/data python scripts/pretrain_shakespeare.py --out runs/shakespeare_base/base.pt
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lfed.data.datasets import load_dataset
from lfed.models.zoo import CharTransformer, count_parameters


def public_share(groups: torch.Tensor, clients: int) -> torch.Tensor:
    """``[n]`` bool: the examples of roles that are not among the first ``clients`` (the federated run's clients)."""
    ids = torch.unique(groups)
    if not 1 <= clients < ids.numel():
        raise ValueError(f"--clients: must be in [1, {ids.numel() - 1}] (the data has {ids.numel()} roles), got {clients}")
    return ~torch.isin(groups, ids[:clients])


def targets(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The next character at every position: ``x[:, 1:]`` then ``y``."""
    return torch.cat([x[:, 1:], y[:, None]], dim=1)


@torch.no_grad()
def evaluate(model: CharTransformer, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> dict[str, float]:
    """Last-position (the federated task's) and all-position accuracy and perplexity."""
    model.eval()
    nll_last = correct_last = nll_all = correct_all = 0.0
    for lo in range(0, x.shape[0], batch):
        xb, yb = x[lo : lo + batch], y[lo : lo + batch]
        logits = model.forward_all(xb)
        t = targets(xb, yb)
        nll_all += float(F.cross_entropy(logits.flatten(0, 1), t.flatten(), reduction="sum"))
        correct_all += float((logits.argmax(-1) == t).sum())
        nll_last += float(F.cross_entropy(logits[:, -1], yb, reduction="sum"))
        correct_last += float((logits[:, -1].argmax(-1) == yb).sum())
    model.train()
    n = x.shape[0]
    return {"acc": correct_last / n, "perplexity": math.exp(nll_last / n), "loss": nll_last / n,
            "acc_all_positions": correct_all / (n * x.shape[1]), "perplexity_all_positions": math.exp(nll_all / (n * x.shape[1])),
            "loss_all_positions": nll_all / (n * x.shape[1])}


def clean_windows(x_test: torch.Tensor, y_test: torch.Tensor, x: torch.Tensor, y: torch.Tensor, n: int = 40) -> torch.Tensor:
    """``[m]`` bool: the test windows (context and next character) that share no run of ``n`` characters with any
    training window's text (context and next character): their text is not part of what the base trains on."""
    def runs(row: list[int]) -> list[bytes]:
        b = bytes(row)
        return [b[i : i + n] for i in range(len(b) - n + 1)]

    if not 1 <= n <= x.shape[1] + 1:
        raise ValueError(f"n: must be in [1, {x.shape[1] + 1}] (a window's length with its next character), got {n}")
    seen = {r for row in torch.cat([x, y[:, None]], 1).tolist() for r in runs(row)}
    return torch.tensor([not any(r in seen for r in runs(row)) for row in torch.cat([x_test, y_test[:, None]], 1).tolist()],
                        dtype=torch.bool)


def text_chains(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The windows in text order: chains of indices in which each window's successor is the window whose text is
    its own shifted by one character (``x[i, 1:]`` then ``y[i]``); one chain per unbroken stretch of text, in
    order of their first window's index."""
    rows = [bytes(r) for r in x.tolist()]
    where = {r: i for i, r in enumerate(rows)}
    if len(where) != len(rows):
        raise ValueError("text_chains: two windows have the same text; their order is ambiguous")
    succ = [where.get(r[1:] + bytes([c])) for r, c in zip(rows, y.tolist())]
    has_pred = {j for j in succ if j is not None}
    chains, seen = [], set()
    for start in range(len(rows)):
        if start in has_pred:
            continue
        chain, i = [], start
        while i is not None and i not in seen:
            seen.add(i)
            chain.append(i)
            i = succ[i]
        chains.append(torch.tensor(chain, dtype=torch.long))
    if len(seen) != len(rows):  # a cycle: a text that repeats itself exactly
        raise ValueError("text_chains: the windows' text runs in a cycle")
    return chains


def passage_holdout(x: torch.Tensor, y: torch.Tensor, n_train: int, fraction: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, val)`` indices into ``x``, the public training windows (the first ``n_train``) then its test windows:
    the windows are put back into passages of text (:func:`text_chains`), passages are drawn in a seeded random
    order until they hold ``fraction`` of the windows, and those passages' windows (training and test) are the
    validation text; the other passages' *training* windows are the training set. No training window continues a
    validation window by a character or is continued by one; a passage may still repeat text of another (the
    caller leaves such validation windows out: :func:`clean_windows`)."""
    if not 0 < fraction < 1:
        raise ValueError(f"--val-fraction: must be in (0, 1), got {fraction}")
    chains = text_chains(x, y)
    if len(chains) < 2:
        raise ValueError("--val-fraction: the public text is one passage; nothing can be held out whole")
    order = torch.randperm(len(chains), generator=torch.Generator().manual_seed(seed))
    val, count = [], 0
    for i in order.tolist():
        if count >= fraction * x.shape[0]:
            break
        val.append(chains[i])
        count += chains[i].numel()
    held = torch.zeros(x.shape[0], dtype=torch.bool)
    held[torch.cat(val)] = True
    train = (~held[:n_train]).nonzero().squeeze(1)
    if train.numel() == 0:
        raise ValueError(f"--val-fraction: {fraction} holds out every training window; hold out less")
    return train, held.nonzero().squeeze(1)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to ``peak / 10``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the base's state dict (base_checkpoint of configs/lora_shakespeare.yaml)")
    p.add_argument("--data-dir", default=os.environ.get("LFED_DATA_DIR"), help="folder holding leaf_shakespeare/ (default $LFED_DATA_DIR)")
    p.add_argument("--clients", type=int, default=9, help="the federated run's data.num_clients: its first roles are left out")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=4.5, help="stop (resumably) after this long; run again to continue")
    p.add_argument("--max-examples", type=int, default=None, help="train on at most this many public examples (smoke tests)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="hold out whole passages, this share of the public windows, and keep the epoch with the lowest NLL on them "
                        "(0: the last epoch)")
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("--data-dir: give the data folder (or set LFED_DATA_DIR)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state_path = out.with_name(out.name + ".train.pt")

    data = load_dataset("shakespeare", Path(args.data_dir))
    train_mask, test_mask = public_share(data.train_groups, args.clients), public_share(data.test_groups, args.clients)
    x, y = data.train_x[train_mask], data.train_y[train_mask]
    if args.max_examples is not None:
        x, y = x[: args.max_examples], y[: args.max_examples]
    x_test, y_test = data.test_x[test_mask], data.test_y[test_mask]
    if args.max_examples is not None:
        x_test, y_test = x_test[: args.max_examples], y_test[: args.max_examples]
    x_val = y_val = None
    if args.val_fraction:  # whole passages of the public text (training and test windows) held out
        x_all, y_all = torch.cat([x, x_test]), torch.cat([y, y_test])
        try:
            keep, held = passage_holdout(x_all, y_all, x.shape[0], args.val_fraction, args.seed)
        except ValueError as err:  # one line, not a traceback
            p.error(str(err))
        x, y, x_val, y_val = x_all[keep], y_all[keep], x_all[held], y_all[held]
        clean = clean_windows(x_val, y_val, x, y)  # none shares text by position; a passage the text repeats may
        if not bool(clean.all()):
            print(f"pretrain: {int((~clean).sum())} validation windows repeat 40 characters of the training text; left out")
        x_val, y_val = x_val[clean], y_val[clean]
        if x_val.shape[0] == 0:
            p.error("--val-fraction: every held-out window repeats training text; hold out more")
    kwargs = dict(vocab_size=data.num_classes, seq_len=x.shape[1], d_model=args.d_model, num_layers=args.num_layers,
                  num_heads=args.num_heads, d_ff=args.d_ff)
    torch.manual_seed(args.seed)
    model = CharTransformer(**kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = math.ceil(x.shape[0] / args.batch_size)
    total = steps_per_epoch * args.epochs
    step, seconds = 0, 0.0
    best: dict = {"epoch": None, "loss": math.inf, "model": None}  # --val-fraction: the best epoch so far
    epochs: list[dict] = []  # per epoch: the validation text's figures (--val-fraction)
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        if state["settings"] != vars(args) | {"out": str(out)}:
            raise ValueError(f"{state_path} was made with other settings {state['settings']}; remove it to start over")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, seconds = state["step"], state["seconds"]
        best, epochs = state.get("best", best), state.get("epochs", epochs)
    print(f"pretrain: CharTransformer {count_parameters(model):,} parameters; {x.shape[0]:,} public training examples "
          f"(roles not among the first {args.clients}), {x_test.shape[0]:,} test; step {step}/{total}", flush=True)
    start = time.monotonic()
    model.train()
    while step < total:
        epoch, at = divmod(step, steps_per_epoch)
        order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        rows = order[at * args.batch_size : (at + 1) * args.batch_size]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, args.lr, args.warmup)
        loss = F.cross_entropy(model.forward_all(x[rows]).flatten(0, 1), targets(x[rows], y[rows]).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step}/{total} epoch {epoch} loss {loss.item():.4f}", flush=True)
        if step % steps_per_epoch == 0 or step == total:
            done = (step - 1) // steps_per_epoch
            print(f"epoch {done} done: test {evaluate(model, x_test, y_test)}", flush=True)
            if x_val is not None:
                held = evaluate(model, x_val, y_val)
                epochs.append({"epoch": done, **held})
                print(f"epoch {done}: validation text ({x_val.shape[0]} windows) {held}", flush=True)
                if held["loss_all_positions"] < best["loss"]:
                    best = {"epoch": done, "loss": held["loss_all_positions"],
                            "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        if time.monotonic() - start > 60 * args.minutes and step < total:
            break
    seconds += time.monotonic() - start
    if step < total:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "seconds": seconds,
                    "best": best, "epochs": epochs, "settings": vars(args) | {"out": str(out)}}, state_path)
        print(f"pretrain: stopped at step {step}/{total} after {seconds:.0f} s in all; run the same command again to continue")
        return {"step": step, "total": total}
    if x_val is not None:  # the base is the epoch best on the validation text
        model.load_state_dict(best["model"])
    metrics = evaluate(model, x_test, y_test)
    torch.save(model.state_dict(), out)
    summary = {"model": "lfed.models.zoo.CharTransformer", "init_args": kwargs, "parameters": count_parameters(model),
               "public_train_examples": int(x.shape[0]), "public_test_examples": int(x_test.shape[0]),
               "clients_left_out": args.clients, "steps": total, "seconds": round(seconds, 1), "test": metrics,
               "settings": vars(args)}
    if x_val is not None:
        summary.update({"selected_epoch": best["epoch"], "public_val_examples": int(x_val.shape[0]), "epochs": epochs,
                        "val": evaluate(model, x_val, y_val)})
    out.with_name(out.name + ".json").write_text(json.dumps(summary, indent=2))
    state_path.unlink(missing_ok=True)
    print(f"pretrain: wrote {out} ({seconds:.0f} s): test {metrics}")
    return summary


if __name__ == "__main__":
    main()
