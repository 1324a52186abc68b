"""Each extension point of docs/extending.md, met as a user's own file meets it (issue 41): it works, or it is
stopped with one line (a :class:`lfed.checks.HookError` / ``ValueError``) naming the hook and the fix.

The user's files are written under ``tmp_path`` and imported from there, as ``class_path`` would.
"""

from __future__ import annotations

import importlib
import textwrap
import warnings

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_objectives import BACKENDS, W_INIT, grad, toy_data, toy_module

from lfed.base.declaration import Declaration, Needs
from lfed.checks import HookError


def gd_free(w, k, steps, lr=0.1):
    """Client ``k``'s plain local gradient descent from ``w`` (the toy problem's full batches)."""
    for _ in range(steps):
        w = w - lr * grad(w, k)
    return w


def user_file(tmp_path, monkeypatch, name: str, source: str):
    """The user's module ``name`` with ``source``, imported from ``tmp_path``."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return importlib.import_module(name)


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------- 1. a LossTerm with aux=None

PROX_NO_AUX = """
import torch
from lfed.client.objectives import ClientRule
from lfed.engine import LossTerm


class ProxNoAux(ClientRule):
    def __init__(self, mu: float = 0.5):
        super().__init__()
        self.mu = mu

    def loss_term(self, cohort, w_start):
        def prox(params, out, x, y, aux):           # aux is None: the start weights come from the closure
            w = torch.cat([p.reshape(-1) for p in params.values()])
            return 0.5 * self.mu * (w - w_start).square().sum()

        return LossTerm(prox)                       # aux=None, as the docs allow
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loss_term_without_aux_trains_on_both_backends(backend, tmp_path, monkeypatch):
    from lfed.client.objectives import Prox

    user = user_file(tmp_path, monkeypatch, f"prox_no_aux_{backend}", PROX_NO_AUX)
    by_loss = toy_module(user.ProxNoAux(0.5), backend)
    run_rounds(by_loss, toy_data(), rounds=2)
    by_rule = toy_module(Prox(0.5), backend)
    run_rounds(by_rule, toy_data(), rounds=2)
    torch.testing.assert_close(flat_weights(by_loss), flat_weights(by_rule), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------- 2. the loss term's output shape

SHAPED = """
import torch
from lfed.client.objectives import ClientRule
from lfed.engine import LossTerm


class Shaped(ClientRule):
    def __init__(self, columns: int = 1):
        super().__init__()
        self.columns = columns

    def loss_term(self, cohort, w_start):
        def term(params, out, x, y, aux):
            return 0.1 * out[:, :1].square().expand(-1, self.columns)   # [B, columns]: not [B]
        return LossTerm(term)
"""


@pytest.mark.parametrize("columns", [1, 3])
def test_a_loss_term_of_another_shape_is_refused_alike_on_both_backends(columns, tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, f"shaped_{columns}", SHAPED)
    messages = []
    for backend in BACKENDS:
        m = toy_module(user.Shaped(columns), backend)
        with pytest.raises(HookError) as info:
            run_rounds(m, toy_data(), rounds=1)
        messages.append(one_line_error(info))
    assert messages[0] == messages[1]  # one rule, one message
    assert messages[0].startswith(f"loss_term: its function returned shape [B, {columns}]")
    assert "return [B]" in messages[0] and ".reshape(-1)" in messages[0]


def test_a_broken_hook_in_round_0_is_one_line_on_the_command_line(tmp_path, monkeypatch, capsys):
    from test_cli_errors import base, last_line, run_main

    user_file(tmp_path, monkeypatch, "shaped_cli", SHAPED)
    code, err = run_main(monkeypatch, capsys, [*base(tmp_path), "--model.objective", "shaped_cli.Shaped"])
    assert code == 2 and "Traceback" not in err, err
    assert last_line(err).startswith("lfed fit: error: loss_term: its function returned shape [B, 1]")


# ------------------------------------------------------------------------------- 3. model.features without layer=

FEATURES = """
import torch
from lfed.client.objectives import ClientRule
from lfed.engine import LossTerm


class Features(ClientRule):
    def loss_term(self, cohort, w_start):
        def term(params, out, x, y, aux, model):
            return model.features.detach().square().sum(-1)      # no layer= given
        return LossTerm(term)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_features_without_a_layer_names_the_fix(backend, tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, f"features_{backend}", FEATURES)
    m = toy_module(user.Features(), backend)
    with pytest.raises(HookError) as info:
        run_rounds(m, toy_data(), rounds=1)
    message = one_line_error(info)
    assert message.startswith("loss_term: model.features") and "layer='<submodule>'" in message


# ------------------------------------------------------------------------------- 4. needs_start_loss forgotten

FORGOT = """
from lfed.server.combination import ServerCombination


class LossWeighted(ServerCombination):            # reads cohort.start_loss, forgets to declare Needs(start_loss=True)
    def combine(self, updates, weights, cohort):
        F = cohort.start_loss[cohort.counting].to(updates.dtype)
        return (F[:, None] * updates[cohort.counting]).sum(0) / F.sum(), None
"""


def test_reading_start_loss_without_needs_start_loss_names_the_flag(tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, "forgot_start_loss", FORGOT)
    m = toy_module("plain", "vmap", combination=user.LossWeighted())
    with pytest.raises(HookError) as info:
        run_rounds(m, toy_data(), rounds=1)
    message = one_line_error(info)
    assert message.startswith("cohort.start_loss:") and "declares = Declaration(needs=Needs(start_loss=True))" in message
    user.LossWeighted.declares = Declaration(needs=Needs(start_loss=True))  # the fix
    m = toy_module("plain", "vmap", combination=user.LossWeighted())
    run_rounds(m, toy_data(), rounds=1)
    assert torch.isfinite(flat_weights(m)).all()


# ------------------------------------------------------------------------------- 5. combine returning a bare tensor

BARE = """
from lfed.server.combination import ServerCombination


class BareMean(ServerCombination):
    def combine(self, updates, weights, cohort):
        return updates[cohort.counting].mean(0)          # Δ alone, no (Δ, None)


class Wrong(ServerCombination):
    def combine(self, updates, weights, cohort):
        return [updates.mean(0)]
"""


def test_combine_may_return_the_bare_update_and_anything_else_is_named(tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, "bare_combine", BARE)
    bare = toy_module("plain", "vmap", combination=user.BareMean())
    run_rounds(bare, toy_data(), rounds=1)
    expected = W_INIT + torch.stack([gd_free(W_INIT, k, 2) - W_INIT for k in range(3)]).mean(0)
    torch.testing.assert_close(flat_weights(bare), expected, atol=1e-13, rtol=0)
    wrong = toy_module("plain", "vmap", combination=user.Wrong())
    with pytest.raises(HookError) as info:
        run_rounds(wrong, toy_data(), rounds=1)
    message = one_line_error(info)
    assert message.startswith("combine: Wrong.combine returned list") and "(Δ, None)" in message


# ------------------------------------------------------------------------------- 6. personal_rows, not personalized

PERSONAL = """
from lfed.client.objectives import ClientRule


class Mine(ClientRule):                             # forgets to declare Supports(personalized=True)
    def personal_rows(self, clients, w, local):
        return w.expand(clients.numel(), -1)
"""


def test_personal_rows_without_personalized_is_refused_before_round_0(tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, "personal_unflagged", PERSONAL)
    m = toy_module(user.Mine(), "vmap")
    with pytest.raises(ValueError) as info:
        run_rounds(m, toy_data(), rounds=1)
    message = one_line_error(info)
    assert message.startswith("objective: Mine defines personal_rows") and \
        "declares = Declaration(supports=Supports(personalized=True))" in message
    assert m.rounds_done == 0


# ------------------------------------------------------------------------------- 7. the hooks' context: lr, label counts

CONTEXT = """
import torch
from lfed.client.objectives import ClientRule
from lfed.engine import LossTerm
from lfed.server.combination import ServerCombination

seen = {}


class LrScaled(ServerCombination):                  # reads the round's client lr
    def combine(self, updates, weights, cohort):
        seen["lr"] = cohort.plan.client_lr
        return updates[cohort.counting].mean(0) / (10 * cohort.plan.client_lr), None


class LabelAware(ClientRule):                       # a loss term per client from its label counts (FedLC-like)
    def loss_term(self, cohort, w_start):
        seen["counts"] = cohort.label_counts.clone()
        prior = cohort.label_counts.to(w_start.dtype).sum(1)          # [K]: each client's own number

        def term(params, out, x, y, n):
            return 0.0 * n * out[:, 0]                                # [B]
        return LossTerm(term, prior)
"""


def test_the_hooks_see_the_client_lr_and_the_clients_label_counts(tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, "hook_context", CONTEXT)
    m = toy_module(user.LabelAware(), "vmap", combination=user.LrScaled(), training=dict(client_lr=0.1))
    dm = toy_data()
    run_rounds(m, dm, rounds=1)
    assert user.seen["lr"] == 0.1
    counts = dm.data.label_counts  # [N, C] of the data's clients
    assert counts.shape == (3, 3) and counts.sum() > 0
    assert torch.equal(user.seen["counts"].cpu(), counts[m.last_round.cohort.clients.cpu()])
    expected = W_INIT + torch.stack([gd_free(W_INIT, k, 2) - W_INIT for k in range(3)]).mean(0) / (10 * 0.1)
    torch.testing.assert_close(flat_weights(m), expected, atol=1e-13, rtol=0)


def test_qffl_takes_its_lipschitz_constant_from_the_client_lr(monkeypatch):
    from conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import qffl

    given = toy_module("plain", "vmap", combination=qffl.QFedAvg(q=2.0, lipschitz=4.0), training=dict(client_lr=0.25))
    run_rounds(given, toy_data(), rounds=1)
    derived = toy_module("plain", "vmap", combination=qffl.QFedAvg(q=2.0), training=dict(client_lr=0.25))  # L = 1/η
    run_rounds(derived, toy_data(), rounds=1)
    torch.testing.assert_close(flat_weights(derived), flat_weights(given), atol=1e-15, rtol=0)


# ------------------------------------------------------------------------------- 8. pl_module.fed of 0.2 callbacks

CALLBACK = """
from lightning.pytorch import Callback

seen = []


class OldCallback(Callback):                        # written against lfed 0.2
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        seen.append(pl_module.fed.num_clients)
"""


def test_a_02_callback_reading_pl_module_fed_is_told_its_successor(tmp_path, monkeypatch):
    user = user_file(tmp_path, monkeypatch, "old_callback", CALLBACK)
    m = toy_module("plain", "vmap")
    with pytest.warns(FutureWarning, match=r"pl_module\.fed \(lfed 0\.2\) is gone.*pl_module\.data"):
        run_rounds(m, toy_data(), rounds=1, callbacks=[user.OldCallback()])
    assert user.seen == [3]


# ------------------------------------------------------------------------------- 9. server_step outside a Trainer


def test_server_step_with_configure_optimizers_moves_the_model_outside_a_trainer():
    m = toy_module("plain", "vmap")
    before = flat_weights(m).clone()
    delta = torch.tensor([0.25, -0.5], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        after = m.server_step(m.configure_optimizers())(delta)
    torch.testing.assert_close(after, before + delta, atol=0, rtol=0)  # SGD(lr=1) on -Δ: w + Δ
    torch.testing.assert_close(flat_weights(m), before + delta, atol=0, rtol=0)


def test_a_cohort_without_a_start_loss_can_be_copied_and_every_use_names_the_flag():
    """dataclasses.replace / deepcopy of such a cohort work (the one-run audit adds its canaries this way); any
    use of the missing start loss raises the HookError naming Needs(start_loss=True)."""
    import copy
    import dataclasses

    from lfed.base.component import Cohort

    c = Cohort(0, torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([1, 1]), torch.tensor([1, 1]), 5)
    d = dataclasses.replace(c, round=1)
    copy.deepcopy(d)
    for use in (lambda: d.start_loss[0], lambda: d.start_loss * 2.0, lambda: 2.0 * d.start_loss,
                lambda: torch.exp(d.start_loss), lambda: d.start_loss.to(torch.float64), lambda: float(d.start_loss)):
        with pytest.raises(HookError, match=r"Declaration\(needs=Needs\(start_loss=True\)\)"):
            use()
