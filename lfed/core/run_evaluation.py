"""A run's evaluation and its end-of-run figures (docs/algorithms.md §9, §12, §13): :class:`RunEvaluation`.

:class:`lfed.core.run.FederatedRun` is a :class:`RunEvaluation`: the global model on the test set, the server's
validation split and the clients' held-out splits (a seeded sample of them), the personalized models, the histories
an evaluation keeps (accuracy targets, ``bmta_global``) and the end-of-run summary (``final/*``). Whatever drives the
run (the Lightning driver, a grid, :func:`lfed.core.fit.fit_run`) evaluates through these methods only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from lfed.engine.ranks import Ranks
from lfed.evaluation.scores import (
    client_accuracies,
    client_evaluation,
    evaluate_split,
    is_classification,
    perplexity_summary,
    sample_mean_se,
    worst_share_mean,
)

__all__ = ["RunEvaluation"]


class RunEvaluation:
    """The evaluation and summary half of :class:`lfed.core.run.FederatedRun` (module docstring); it reads the run's
    net, data, components, histories and settings."""

    # ------------------------------------------------------------------ evaluation (docs/algorithms.md §9)
    def client_accuracy(self, ranks: Ranks | None = None, reduce_sum: Callable[[Tensor], Tensor] | None = None) -> Tensor | None:
        """``[N]`` accuracy of the global model on each client's held-out split (NaN without one); None if none has one."""
        ranks = ranks or Ranks()
        return client_accuracies(self.net, self.data, ranks.rank, ranks.world_size, reduce_sum or (lambda t: t))

    def evaluate(self, ranks: Ranks, reduce_sum: Callable[[Tensor], Tensor], batch_size: int = 2048) -> tuple[dict[str, float], Tensor | None]:
        """The global model on the test set, the server's validation split and the clients' held-out splits
        (accuracy; with token inputs, a language model, also each client's perplexity ``exp(mean NLL)``).

        Each rank evaluates its share, the sums are reduced over the ranks (``reduce_sum``), so every
        example counts once. Returns the metrics and the per-client accuracies (for :meth:`record_evaluation`).
        """
        d = self.data
        classification = is_classification(d.test_y)
        metrics = evaluate_split(self.net, self.loss_fn, d.test_x, d.test_y, ranks, reduce_sum, batch_size, classification)
        if d.has_validation:  # the server's validation split (data.validation_fraction)
            val = evaluate_split(self.net, self.loss_fn, d.train_x[d.val_index], d.train_y[d.val_index], ranks,
                                 reduce_sum, batch_size, classification)
            metrics.update({k.replace("test/", "val/"): v for k, v in val.items()})
        tokens = not (d.train_x.dtype.is_floating_point or d.train_x.dtype.is_complex)  # a language model: perplexity too
        sample = self.client_sample_ids()  # None: every client with a held-out split
        evaluated = client_evaluation(self.net, d, ranks.rank, ranks.world_size, reduce_sum, batch_size, nll=tokens,
                                      clients=sample)
        per_client = None if evaluated is None else evaluated[0]
        metrics.update(self.schedule.evaluation_metrics())  # against simulated time too (lfed.core.synchronous)
        metrics.update(self.components.sampler.evaluation_metrics())  # or a sampler's (AvailableSampler's clock)
        metrics.update(self.components.attack.evaluation_metrics(  # a backdoor's success rate (docs/robustness.md §1.7)
            d, lambda x, y: evaluate_split(self.net, self.loss_fn, x, y, ranks, reduce_sum, batch_size, classification)))
        if per_client is not None:
            client = per_client[~torch.isnan(per_client)]
            metrics["client/acc_mean"] = float(client.mean())
            metrics["client/acc_worst10pct"] = worst_share_mean(client, 0.1)  # (0.4's client/acc_worst10, not logged since 0.6)
            if sample is not None:  # a sample of the population: the mean's standard error (without replacement)
                metrics["client/evaluated"] = float(client.numel())
                metrics["client/acc_mean_se"] = sample_mean_se(client, int((d.host("holdout_sizes") > 0).sum()))
            metrics.update(self.personal_evaluation(evaluated, ranks, reduce_sum, tokens, batch_size))
        if evaluated is not None and evaluated[1] is not None:  # docs/algorithms.md §12: each client's perplexity exp(mean NLL)
            ppl = perplexity_summary(evaluated[1], "client")  # the one formula of personal/* and global/* too
            metrics.update(ppl)  # client/perplexity_mean, client/perplexity_worst10pct
        return metrics, per_client

    def client_sample_ids(self) -> Tensor | None:
        """``[n]`` the clients whose held-out splits score the global model (sorted), or None: every client with one.
        A seeded sample of ``client_sample`` of them when there are more (fixed for the run: ``(seed, "client_sample")``),
        kept after its first draw."""
        from lfed.rng import round_generator

        if self.client_sample is None:
            return None
        cached = self.__dict__.get("_client_sample_ids", False)
        if cached is not False:
            return cached
        d = self.data
        has = d.host("holdout_sizes") > 0
        count = int(has.sum())
        out = None
        if count > self.client_sample:
            clients = has.nonzero().squeeze(1)
            pick = torch.randperm(count, generator=round_generator(self.seed, 0, "client_sample"))
            out = clients[pick[: self.client_sample].sort().values].to(d.holdout_sizes.device)
        self.__dict__["_client_sample_ids"] = out
        return out

    def personal_sample(self) -> Tensor:
        """The clients of the personalized evaluation: every client with a held-out split (those of the client sample,
        :meth:`client_sample_ids`, when there is one), or a seeded sample of ``personal_clients`` of them (fixed for the
        run: drawn from ``(seed, "personal_sample")``)."""
        from lfed.rng import round_generator

        d = self.data
        sampled = self.client_sample_ids()
        clients = (d.holdout_sizes > 0).nonzero().squeeze(1) if sampled is None else sampled
        if self.personal_clients is not None and self.personal_clients < clients.numel():
            pick = torch.randperm(clients.numel(), generator=round_generator(self.seed, 0, "personal_sample"))
            clients = clients[pick[: self.personal_clients].sort().values.to(clients.device)]
        return clients

    def personal_evaluation(self, evaluated: tuple[Tensor, Tensor | None], ranks: Ranks,
                            reduce_sum: Callable[[Tensor], Tensor], tokens: bool, batch_size: int = 2048) -> dict[str, float]:
        """docs/algorithms.md §13: each sampled client's personalized model and the global model on the client's own splits.

        ``global/acc_*`` are the global model's accuracies (``evaluated``: :func:`~lfed.evaluation.scores.client_evaluation`'s
        accuracies and NLLs on every client's held-out split) on the sampled clients; ``personal/acc_*`` are those of
        each client's own model where the objective has one (:meth:`~lfed.client.objectives.ClientRule.personal_models`:
        a personalized rule's :meth:`~lfed.client.objectives.ClientRule.personal_rows`), built ``personal_chunk``
        clients per vmapped call (:func:`lfed.evaluation.scores.personal_scores`). Each: the mean over clients, the
        mean of the worst 10% (``ceil(0.1 n)`` clients) and the standard deviation (population, ``1/n``).
        With clients' own validation splits (``data.client_validation_fraction``) the same on them,
        ``global_val/*`` and ``personal_val/*`` (each chunk's models made once for both splits); on token
        data (``tokens``) also ``*/perplexity_mean`` and ``*/perplexity_worst10pct`` (docs/algorithms.md §12).
        At most ``batch_size`` examples go through the net at once (``data.eval_batch_size``).
        Every rank computes all of it (the same numbers).
        """
        from lfed.evaluation.scores import accuracy_summary, perplexity_summary, personal_scores

        clients = self.personal_sample()
        if clients.numel() == 0:
            return {}
        d = self.data

        def summaries(acc: Tensor, nll: Tensor | None, prefix: str) -> dict[str, float]:
            out = accuracy_summary(acc, prefix)
            if tokens and nll is not None:
                out.update(perplexity_summary(nll, prefix))
            return out

        at = clients.to(evaluated[0].device)
        glob = evaluated[0][at]
        self.last_personal = {"clients": clients.cpu(), "global": glob.cpu()}
        metrics = summaries(glob, None if evaluated[1] is None else evaluated[1][at], "global")
        splits: tuple[str, ...] = ("test",)
        if d.has_client_validation:
            splits = ("test", "val")
            val = client_evaluation(self.net, d, ranks.rank, ranks.world_size, reduce_sum, batch_size, nll=tokens, split="val",
                                    clients=self.client_sample_ids())
            if val is not None:
                metrics.update(summaries(val[0][at], None if val[1] is None else val[1][at], "global_val"))
        with torch.inference_mode(False), torch.enable_grad():  # FedAvg-FT trains in the validation loop
            w = self.layout.module_vector(self.net)
            models = self.components.objective.personal_models(w, lambda c: self.local_work(c, ranks))  # none: global only
            for prefix, rows in models.items():
                scores = personal_scores(self.net, self.layout, d, clients, rows, self.personal_chunk, splits=splits,
                                         nll=tokens, batch=batch_size)
                self.last_personal[prefix] = scores["test"][0].cpu()
                for split, (acc, nll) in scores.items():
                    metrics.update(summaries(acc, nll, prefix if split == "test" else f"{prefix}_val"))
        return metrics

    def local_work(self, clients: Tensor, ranks: Ranks):
        """A :class:`~lfed.base.component.LocalWork` over ``clients``' training data: the run's batch size, step budget
        (``steps_done``) and ``client_lr``; batches seeded by ``(seed, rounds done, stream)``."""
        from lfed.base.component import LocalWork

        d, plan = self.data, self.training_plan
        n_k = d.client_sizes[clients]
        return LocalWork(self.engine, ranks, *d.gather(clients), self.seed,
                         self.rounds_done, n_k, plan.step_budget(n_k), plan.client_lr, plan.batch_size, plan)

    def accuracy_histogram(self, path: str | Path) -> Path | None:
        """A histogram of the last evaluation's per-client accuracies (personalized and global) saved to ``path``
        (PNG, matplotlib); None when there was none or matplotlib is missing."""
        last = self.last_personal
        if last is None or self.metric_gate.name("personal/acc_histogram") is None:  # per-client accuracies: not under DP
            return None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        fig, ax = plt.subplots(figsize=(6, 4))
        bins = torch.linspace(0, 1, 21).tolist()
        for key, label in (("global", "global model"), ("personal", "personalized models")):
            if key in last:
                ax.hist(last[key].numpy(), bins=bins, alpha=0.6, label=f"{label} (mean {float(last[key].mean()):.3f})")
        ax.set_xlabel("accuracy on the client's own held-out split")
        ax.set_ylabel("clients")
        ax.set_title(f"{self.label}: {last['clients'].numel()} clients, after {self.rounds_done} rounds")
        ax.legend()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return path

    def record_evaluation(self, rounds_done: int, metrics: dict[str, float], per_client: Tensor | None) -> None:
        """Keep an evaluation of training (histories, accuracy targets, ``bmta_global``)."""
        if "val/acc" in metrics:
            self.val_history.append((rounds_done, metrics["val/acc"]))
        acc = metrics.get("test/acc")
        if acc is not None:
            self.eval_history.append((rounds_done, acc))
            self.comm.log_accuracy(acc)
            if per_client is not None:
                self.bmta.add_evaluation(per_client)

    # ------------------------------------------------------------------ end of run
    def last_rounds_accuracy(self, share: float = 0.1, split: str = "test") -> float | None:
        """Mean accuracy over the evaluations in the last ``share`` of rounds (IGFL's figure).

        ``split``: ``test`` (the global test set) or ``val`` (the server's validation split).
        """
        history = {"test": self.eval_history, "val": self.val_history}[split]
        if not history:
            return None
        last = history[-1][0]
        cutoff = last - max(1, math.ceil(share * last))
        accs = [a for r, a in history if r > cutoff]
        return sum(accs) / len(accs)

    def summary(self) -> dict[str, float]:
        """The end-of-run figures (``final/*``); also kept as :attr:`final_summary`."""
        out: dict[str, float] = {}
        for key, split in (("final/test_acc_last10pct", "test"), ("final/val_acc_last10pct", "val")):
            value = self.last_rounds_accuracy(split=split)
            if value is not None:
                out[key] = value
        if self.eval_history:
            out["final/test_acc"] = self.eval_history[-1][1]
        for target in self.accuracy_targets:
            hit = self.comm.rounds_to_reach(target)
            if hit is not None:
                out[f"final/rounds_to_{target:g}"] = hit[0]
                out[f"final/uploads_to_{target:g}"] = hit[1]
        out["final/uploads_total"] = self.comm.uploads
        clock = self.schedule.step_times()  # simulated seconds after each step (lfed.core.synchronous; none if synchronous)
        if clock:
            out["final/simulated_time"] = clock[-1]
        for target in self.accuracy_targets:
            hit = self.comm.rounds_to_reach(target)
            if hit is not None and 0 < hit[0] <= len(clock):
                out[f"final/time_to_{target:g}"] = clock[hit[0] - 1]
        out.update(self.bmta.summary())
        for component in self.components.each():  # DP: ε, δ, z
            out.update(component.summary())
        out = self.metric_gate(out)
        self.final_summary = out
        return out
