"""FedNova (Wang, Liu, Liang, Joshi, Poor 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", Eq. 6-7, vanilla local SGD) as a user's own server
combination, outside lfed.

Clients that took different numbers of local steps ``τ_k`` (stragglers, uneven data) are
normalised before averaging: with the aggregation weights ``p_k`` (normalised over the clients
whose work counts) and updates ``u_k = w̄_k − w^t``,

    Δ = τ_eff Σ_k p_k u_k / τ_k,   τ_eff = Σ_k p_k τ_k.

With equal ``τ_k`` it is FedAvg. It reads the steps each client did from the cohort
(``cohort.steps_done``); nothing else is needed.

    model:
      combination: {class_path: fednova.FedNova}
"""

from __future__ import annotations

from lfed.server import ServerCombination


class FedNova(ServerCombination):
    name = "fednova"

    def combine(self, updates, weights, cohort):
        counted = cohort.counting
        p = weights[counted].to(updates.dtype)
        p = p / p.sum()
        tau = cohort.steps_done[counted].to(updates.dtype)
        tau_eff = (p * tau).sum()
        return tau_eff * ((p / tau) @ updates[counted]), None
