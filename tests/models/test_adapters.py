"""LoRA adapters on a frozen base (lfed.models.adapters, SPEC §12), checked by hand.

The federated tests adapt the bias-free linear regression of tests/client/test_objectives.py
(``f(x) = w₀·x``, three clients of 2, 3 and 4 examples, squared loss, full-batch steps, float64):
with rank 1 the adapted model is ``h(x) = w₀·x + s b (a·x)``, ``s = α/r``, ``a = A [1, 2]``,
``b = B [1, 1]``, and for client k with residuals ``r_i = h(x_i) - y_i``

    ∂f_k/∂a = (2/n_k) Σ_i r_i s b x_i,      ∂f_k/∂b = (2/n_k) Σ_i r_i s (a·x_i).

Each round every client takes two local steps on (a, b) together (on b alone for FFA-LoRA),
and the server averages with the size weights ``n_k / n``.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import run_rounds
from lightning.pytorch import Callback
from test_checkpoint import assert_same_state, fit, load, run_state, write_config
from test_objectives import CLIENT_ROWS, W_INIT, X, Y, squared_loss, toy_data
from torch import nn

from lfed.engine.params import ParamLayout
from lfed.lightning.module import FederatedModule
from lfed.models.adapters import LoRA, load_base, lora_targets

BACKENDS = ["vmap", "loop"]
TOL = dict(atol=1e-13, rtol=0)
A0 = torch.tensor([0.5, -1.0], dtype=torch.float64)
ALPHA, RANK = 2.0, 1
S = ALPHA / RANK


# ----------------------------------------------------------------------------- one layer
def test_a_lora_layer_computes_base_plus_scaled_BAx_by_hand():
    lin = nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 1.0]]))
        lin.bias.copy_(torch.tensor([0.5, -0.5]))
    m = LoRA(nn.Sequential(lin), rank=1, alpha=2.0, target=["0"])
    A, B = m.adapters()["0"]
    with torch.no_grad():
        A.copy_(torch.tensor([[1.0, 0.0, -1.0]]))
        B.copy_(torch.tensor([[2.0], [-1.0]]))
    x = torch.tensor([[1.0, 1.0, 2.0]])
    # W₀x + b₀ = [9.5, 0.5]; A x = -1; B A x = [-2, 1]; (α/r) = 2: h = [9.5 - 4, 0.5 + 2]
    assert torch.equal(m(x), torch.tensor([[5.5, 2.5]]))
    assert m.scaling == 2.0


def test_the_adapted_net_starts_as_the_base_with_a_seeded_kaiming_A():
    torch.manual_seed(1)
    base = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(4, 8)
    want = base(x)
    state = torch.get_rng_state()
    m = LoRA(base, rank=2, alpha=4.0, target=["*"], seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # A is drawn from its own seed, not torch's generator
    assert m.adapted == ["0", "2"]
    assert torch.equal(m(x), want)  # B = 0
    for name, (A, B) in m.adapters().items():
        d_in = A.shape[1]
        assert B.abs().sum() == 0 and A.abs().max() <= 1 / d_in**0.5 and A.abs().max() > 0.5 / d_in**0.5, name
    again = LoRA(nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)), rank=2, alpha=4.0, seed=5)
    other = LoRA(nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)), rank=2, alpha=4.0, seed=6)
    assert torch.equal(again.adapters()["0"][0], m.adapters()["0"][0])
    assert not torch.equal(other.adapters()["0"][0], m.adapters()["0"][0])
    # only the adapters train: P = 2*8 + 6*2 + 2*6 + 3*2
    layout = ParamLayout.from_module(m)
    assert layout.num_params == 16 + 12 + 12 + 6
    assert all(".lora_" in n for n in layout.names)
    ffa = ParamLayout.from_module(LoRA(nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)), rank=2, freeze_a=True))
    assert ffa.names == ("net.0.lora_B.default.weight", "net.2.lora_B.default.weight") and ffa.num_params == 12 + 6


# ----------------------------------------------------------------------------- bad input, before round 0
def test_no_matching_layer_is_refused_naming_the_nets_linear_layers():
    with pytest.raises(ValueError, match=r"target: no linear layer of Sequential matches \['\*\.fc\*'\]; its linear layers are: 0, 2"):
        LoRA(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), target=["*.fc*"])
    with pytest.raises(ValueError, match="it has no nn.Linear layer"):
        lora_targets(nn.Sequential(nn.Conv2d(1, 2, 3)), ["*"])
    with pytest.raises(ValueError, match=r"the net itself is one: wrap it"):
        LoRA(nn.Linear(4, 4), target=["*"])
    with pytest.raises(ValueError, match=r"target: a non-empty list of module-name patterns"):
        LoRA(nn.Sequential(nn.Linear(4, 4)), target=[])


def test_a_rank_larger_than_a_layers_width_is_refused():
    with pytest.raises(ValueError, match=r"rank: 3 is larger than layer '2' allows: min\(in_features=4, out_features=2\) = 2"):
        LoRA(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), rank=3)
    with pytest.raises(ValueError, match="rank"):
        LoRA(nn.Sequential(nn.Linear(4, 4)), rank=0)
    with pytest.raises(ValueError, match="alpha"):
        LoRA(nn.Sequential(nn.Linear(4, 4)), alpha=0.0)


def test_a_base_checkpoint_is_loaded_and_one_that_does_not_fit_is_refused(tmp_path):
    torch.manual_seed(0)
    pretrained = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    path = tmp_path / "base.pt"
    torch.save(pretrained.state_dict(), path)
    m = LoRA(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), rank=1, base_checkpoint=str(path))
    with pytest.raises(RuntimeError, match=r"base_checkpoint .*base.pt is not loaded yet; call load_pretrained\(\) first"):
        m(torch.randn(1, 4))
    m.load_pretrained()
    assert torch.equal(m.base_layer("0").weight, pretrained[0].weight) and torch.equal(m.base_layer("2").bias, pretrained[2].bias)
    x = torch.randn(5, 4)
    assert torch.equal(m(x), pretrained(x))
    with pytest.raises(ValueError, match=r"does not fit Sequential: shapes differ: 0.weight \(file \[3, 4\], model \[5, 4\]\)"):
        LoRA(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(3, 2)), rank=1, base_checkpoint=str(path)).load_pretrained()
    with pytest.raises(ValueError, match=r"missing: 4.weight, 4.bias"):
        load_base(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 2)), path)
    with pytest.raises(ValueError, match=r"unexpected: 2.weight, 2.bias"):
        load_base(nn.Sequential(nn.Linear(4, 3)), path)
    with pytest.raises(FileNotFoundError, match="base_checkpoint: no file at"):
        LoRA(nn.Sequential(nn.Linear(4, 3)), rank=1, base_checkpoint=str(tmp_path / "nope.pt")).load_pretrained()
    # an lfed checkpoint's global model ('net.*' entries) is a base too
    torch.save({"state_dict": {f"net.{k}": v for k, v in pretrained.state_dict().items()}, "lfed": {}}, tmp_path / "run.ckpt")
    m = LoRA(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), rank=1, base_checkpoint=str(tmp_path / "run.ckpt"))
    m.load_pretrained()
    assert torch.equal(m(x), pretrained(x))
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="holds a list, not a state dict"):
        load_base(nn.Sequential(nn.Linear(4, 3)), tmp_path / "list.pt")


def test_without_peft_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"pip install 'lfed\[adapters\]'"):
        LoRA(nn.Sequential(nn.Linear(4, 4)))


# ----------------------------------------------------------------------------- two federated rounds by hand
def lora_module(backend: str, freeze_a: bool) -> FederatedModule:
    base = nn.Sequential(nn.Linear(2, 1, bias=False)).double()
    with torch.no_grad():
        base[0].weight.copy_(W_INIT[None])
    net = LoRA(base, rank=RANK, alpha=ALPHA, target=["0"], freeze_a=freeze_a).double()
    with torch.no_grad():
        net.adapters()["0"][0].copy_(A0[None])
    return FederatedModule(net, algorithm="fedavg", loss=squared_loss, fraction=1.0, training=dict(client_lr=0.1, batch_size=None, local_steps=2),
                           engine=dict(backend=backend), seed=3)


def local(a, b, k, steps=2, lr=0.1, freeze_a=False):
    x, y = X[CLIENT_ROWS[k]], Y[CLIENT_ROWS[k]].double()
    n = len(CLIENT_ROWS[k])
    for _ in range(steps):
        r = x @ W_INIT + S * b * (x @ a) - y
        ga = 2 / n * (r * S * b) @ x
        gb = 2 / n * (r * S * (x @ a)).sum()
        a, b = (a if freeze_a else a - lr * ga), b - lr * gb
    return a, b


def effective(a, b):
    """The adapted layer's weight ``w₀ + s b a`` (the model the adapters stand for)."""
    return W_INIT + S * b * a


class AfterEachRound(Callback):
    """The adapters and the round's record after every round."""

    def __init__(self) -> None:
        self.rounds = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        A, B = pl_module.net.adapters()["0"]
        self.rounds.append((A.detach().clone(), B.detach().clone(), pl_module.last_round))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("freeze_a", [False, True], ids=["fedavg-of-A-and-B", "ffa-lora"])
def test_two_rounds_of_adapters_by_hand(backend, freeze_a):
    module = lora_module(backend, freeze_a)
    net = module.net
    base_before = net.base_layer("0").weight.detach().clone()
    seen = AfterEachRound()
    run_rounds(module, toy_data(), 2, callbacks=[seen])
    assert module.layout.num_params == (1 if freeze_a else 3)
    p = torch.tensor([len(r) for r in CLIENT_ROWS], dtype=torch.float64)
    p = p / p.sum()
    a, b = A0.clone(), torch.tensor(0.0, dtype=torch.float64)
    assert len(seen.rounds) == 2
    for r, (A, B, rec) in enumerate(seen.rounds):
        clients = [local(a, b, k, freeze_a=freeze_a) for k in range(3)]
        a_new = sum(p[k] * clients[k][0] for k in range(3))
        b_new = sum(p[k] * clients[k][1] for k in range(3))
        torch.testing.assert_close(A[0], a_new, **TOL)
        torch.testing.assert_close(B[0, 0], b_new, **TOL)
        # the clients' uploads: the engine's w_k_end rows, in the cohort's order
        assert sorted(rec.cohort.clients.tolist()) == [0, 1, 2]
        for row, k in zip(rec.result.weights, rec.cohort.clients.tolist()):
            want = clients[k][1][None] if freeze_a else torch.cat([clients[k][0], clients[k][1][None]])
            torch.testing.assert_close(row, want, **TOL)
        assert rec.bits_up == 3 * 32 * module.layout.num_params
        mean_of_products = sum(p[k] * effective(*clients[k]) for k in range(3))
        gap = (effective(a_new, b_new) - mean_of_products).abs().max()
        if freeze_a:  # FFA-LoRA: s mean(b_k) a = mean(s b_k a), exactly
            assert gap < 1e-15, gap
        elif r == 1:  # A and B averaged apart: not the average of the clients' models
            assert gap > 1e-4, gap
        a, b = a_new, b_new
    assert torch.equal(net.base_layer("0").weight, base_before)  # the base, untouched


# ----------------------------------------------------------------------------- resume, checkpoints, CLI
LORA_NET = {"class_path": "lfed.models.adapters.LoRA",
            "init_args": {"net": {"class_path": "lfed.models.zoo.MLP", "init_args": {"in_features": 64, "hidden": [16], "num_classes": 10}},
                          "rank": 2, "alpha": 4.0, "target": ["net.*"]}}


@pytest.mark.parametrize("backend, freeze_a", [("vmap", False), ("loop", True)])
def test_resume_of_an_adapter_run_is_bit_identical(tmp_path, backend, freeze_a):
    keep_all = {"callbacks": [{"class_path": "lfed.lightning.checkpoint.RoundCheckpoint",
                               "init_args": {"dirpath": str(tmp_path / "ckpts"), "every_n_train_steps": 3, "save_top_k": -1}}]}
    net = {**LORA_NET, "init_args": {**LORA_NET["init_args"], "freeze_a": freeze_a}}
    config = write_config(tmp_path / "cfg.yaml", "scaffold", trainer=keep_all, engine={"backend": backend}, net=net)
    straight = fit(config)
    P = (16 * 2 + 10 * 2) if freeze_a else (2 * 64 + 16 * 2 + 2 * 16 + 10 * 2)
    assert straight.model.layout.num_params == P
    want = run_state(straight)
    middle = tmp_path / "ckpts" / "epoch=0-step=3.ckpt"
    state = load(middle)["state_dict"]
    assert state["net.net.net.0.base_layer.weight"].shape == (16, 64)  # the base, once
    assert all(v.shape[-1] == P for k, v in state.items() if k.startswith("objective.") and k.endswith(".rows"))
    got = run_state(fit(config, "--ckpt_path", str(middle)))
    assert_same_state(got, want)


def test_train_leaves_base_parameters_trainable_in_full_and_refuses_an_adapted_layers_weight():
    m = LoRA(nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)), rank=2, target=["0"], train=["2.*"])
    layout = ParamLayout.from_module(m)
    assert layout.names == ("net.0.lora_A.default.weight", "net.0.lora_B.default.weight", "net.2.weight", "net.2.bias")
    assert layout.num_params == 16 + 12 + 18 + 3 and m.trained_in_full == ["2.bias", "2.weight"]
    with pytest.raises(ValueError, match=r"train: '0.\*' matches 0.weight, a weight of an adapted layer"):
        LoRA(nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3)), rank=2, target=["0"], train=["0.*"])
    with pytest.raises(ValueError, match=r"train: pattern 'head.\*' matches no parameter of Sequential; its parameters are: 0.weight"):
        LoRA(nn.Sequential(nn.Linear(8, 6)), rank=2, train=["head.*"])


def test_a_run_loads_its_base_at_set_up_and_refuses_a_base_that_does_not_fit(tmp_path):
    from lfed.models.zoo import MLP

    torch.manual_seed(3)
    pretrained = MLP(in_features=64, hidden=[16], num_classes=10)
    path = tmp_path / "base.pt"
    torch.save(pretrained.state_dict(), path)
    net = {"class_path": "lfed.models.adapters.LoRA",
           "init_args": {"net": {"class_path": "lfed.models.zoo.MLP", "init_args": {"in_features": 64, "hidden": [16], "num_classes": 10}},
                         "rank": 2, "target": ["net.0"], "train": ["net.2.*"], "base_checkpoint": str(path)}}
    cli = fit(write_config(tmp_path / "cfg.yaml", "fedavg", rounds=2, every=0, net=net))
    lora = cli.model.net
    assert cli.model.layout.num_params == 2 * 64 + 16 * 2 + 16 * 10 + 10
    assert torch.equal(lora.base_layer("net.0").weight, pretrained.net[0].weight.double())  # loaded, untouched by 2 rounds
    assert not torch.equal(lora.net.net[2].weight, pretrained.net[2].weight.double())  # the head trained
    assert "client/acc_mean" in cli.trainer.callback_metrics and "client/perplexity_mean" not in cli.trainer.callback_metrics
    wrong = {**net, "init_args": {**net["init_args"], "net": {"class_path": "lfed.models.zoo.MLP",
                                                              "init_args": {"in_features": 64, "hidden": [32], "num_classes": 10}}}}
    fits_not = r"base_checkpoint: .*base.pt does not fit MLP: shapes differ: net.0.weight \(file \[16, 64\], model \[32, 64\]\)"
    with pytest.raises(ValueError, match=fits_not):
        fit(write_config(tmp_path / "wrong.yaml", "fedavg", rounds=2, every=0, net=wrong))


@pytest.mark.usefixtures("one_thread")  # bit for bit needs one intra-op thread (tests/lightning/test_group.py)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_grid_of_adapter_runs_equals_each_run_alone(backend, tmp_path):
    """Each adapter run is its own engine call (lfed.core.lockstep.engine_key): the runs' frozen parts may differ
    (here FFA-LoRA's A, drawn from the seed of each run), and one product of the base over all rows rounds
    differently from the products over each run's rows."""
    from test_group import ROUNDS, assert_members_equal_alone, config

    assert_members_equal_alone([config("lora_digits.yaml")],
                               {"model.training.client_lr": [0.05, 0.1], "model.net.init_args.seed": [0, 1]},
                               [*ROUNDS, f"--model.engine.backend={backend}", "--model.net.init_args.freeze_a=true"], tmp_path,
                               merged_calls_per_round=4)


# ----------------------------------------------------------------------------- the Shakespeare pipeline (real data)
def _pretrain(args):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("pretrain_shakespeare", REPO / "scripts" / "pretrain_shakespeare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--d-ff", "32", "--batch-size", "32",
        "--max-examples", "200", "--epochs", "2"]


def test_pretraining_uses_the_roles_that_are_not_clients_and_resumes_exactly_in_chunks(tmp_path, data_dir):
    pretrain = _pretrain([])
    from lfed.data.datasets import load_dataset

    groups = load_dataset("shakespeare", data_dir).train_groups
    public = pretrain.public_share(groups, 9)
    ids = torch.unique(groups)
    assert set(torch.unique(groups[public]).tolist()) == set(ids[9:].tolist())  # no client's role
    with pytest.raises(ValueError, match=r"--clients: must be in \[1, 9\]"):
        pretrain.public_share(groups, 10)
    straight = tmp_path / "a" / "base.pt"
    summary = pretrain.main(["--out", str(straight), "--data-dir", str(data_dir), *TINY])
    assert summary["steps"] == 2 * 7 and summary["public_train_examples"] == 200
    chunked = tmp_path / "b" / "base.pt"
    calls = 0
    while not chunked.exists():  # --minutes 0: one step per call, the state kept in base.pt.train.pt
        pretrain.main(["--out", str(chunked), "--data-dir", str(data_dir), *TINY, "--minutes", "0"])
        calls += 1
    assert calls == 14 and not chunked.with_name("base.pt.train.pt").exists()
    a, b = torch.load(straight), torch.load(chunked)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_clean_windows_by_hand():
    clean_windows = _pretrain([]).clean_windows
    x, y = torch.tensor([[0, 1, 2], [1, 2, 3], [2, 3, 4]]), torch.tensor([3, 4, 5])  # the training text 0 1 2 3 4 5
    x_test, y_test = torch.tensor([[3, 4, 5], [6, 7, 8], [4, 5, 9]]), torch.tensor([6, 9, 1])
    # runs of 3 in the training text: 012 123 234 345; test texts 3456 (holds 345), 6789, 4591
    assert clean_windows(x_test, y_test, x, y, n=3).tolist() == [False, True, True]
    # runs of 2: 01 12 23 34 45; 3456 holds 34, 45; 4591 holds 45
    assert clean_windows(x_test, y_test, x, y, n=2).tolist() == [False, True, False]
    # runs of 4: 0123 1234 2345; none in a test text
    assert clean_windows(x_test, y_test, x, y, n=4).tolist() == [True, True, True]
    with pytest.raises(ValueError, match=r"n: must be in \[1, 4\]"):
        clean_windows(x_test, y_test, x, y, n=5)


def test_text_chains_and_passage_holdout_by_hand():
    pretrain = _pretrain([])

    def windows(text: list[int]) -> tuple[torch.Tensor, torch.Tensor]:  # width 3, the next character as y
        return torch.tensor([text[i : i + 3] for i in range(len(text) - 3)]), torch.tensor(text[3:])

    xa, ya = windows(list(range(8)))        # passage a: 0..7, windows 0 1 2 -> 3 ... 4 5 6 -> 7 (5 windows)
    xb, yb = windows(list(range(20, 25)))   # passage b: 20..24 (2 windows)
    shuffle = torch.tensor([3, 5, 0, 6, 1, 4, 2])  # rows: a3 b0 a0 b1 a1 a4 a2
    x, y = torch.cat([xa, xb])[shuffle], torch.cat([ya, yb])[shuffle]
    chains = pretrain.text_chains(x, y)
    assert [c.tolist() for c in chains] == [[1, 3], [2, 4, 6, 0, 5]]  # b0 b1 (row 1 starts it), then a0 .. a4
    with pytest.raises(ValueError, match="same text"):
        pretrain.text_chains(torch.cat([x, x[:1]]), torch.cat([y, y[:1]]))
    # the first 5 rows are training windows, the last 2 (a4, a2) test windows; any fraction > 0 takes >= 1 passage
    for seed in range(4):
        train, val = pretrain.passage_holdout(x, y, 5, 0.2, seed)
        first = int(torch.randperm(2, generator=torch.Generator().manual_seed(seed))[0])
        held = set(chains[first].tolist())
        assert set(val.tolist()) == held  # one whole passage, its test window too
        assert set(train.tolist()) == {i for i in range(5) if i not in held}  # the other passage's training windows
    with pytest.raises(ValueError, match="every training window"):
        pretrain.passage_holdout(x, y, 5, 0.9, 0)  # both passages
    with pytest.raises(ValueError, match=r"--val-fraction: must be in \(0, 1\)"):
        pretrain.passage_holdout(x, y, 5, 1.0)
    with pytest.raises(ValueError, match="one passage"):
        pretrain.passage_holdout(xa, ya, 5, 0.5)


def test_early_stopped_pretraining_keeps_the_epoch_best_on_held_out_passages(tmp_path, data_dir, capsys):
    pretrain = _pretrain([])
    from lfed.data.datasets import load_dataset
    from lfed.models.zoo import CharTransformer

    args = [*TINY[:-1], "4", "--val-fraction", "0.3", "--lr", "0.3", "--clients", "8"]  # 4 epochs; public: 2 roles
    out = tmp_path / "a" / "base.pt"
    summary = pretrain.main(["--out", str(out), "--data-dir", str(data_dir), *args])
    losses = [e["loss_all_positions"] for e in summary["epochs"]]
    assert [e["epoch"] for e in summary["epochs"]] == [0, 1, 2, 3]
    assert summary["selected_epoch"] == min(range(4), key=losses.__getitem__)
    assert summary["selected_epoch"] < 3  # at this high lr it overfits: the base written is not the last epoch's
    data = load_dataset("shakespeare", data_dir)  # rebuild the split: the written base scores the selected epoch
    train, test = pretrain.public_share(data.train_groups, 8), pretrain.public_share(data.test_groups, 8)
    x, y = torch.cat([data.train_x[train][:200], data.test_x[test][:200]]), torch.cat([data.train_y[train][:200], data.test_y[test][:200]])
    keep, held = pretrain.passage_holdout(x, y, 200, 0.3, 0)
    assert not set(keep.tolist()) & set(held.tolist()) and int(keep.max()) < 200
    assert summary["public_train_examples"] == keep.numel()
    clean = pretrain.clean_windows(x[held], y[held], x[keep], y[keep])
    assert summary["public_val_examples"] == int(clean.sum()) > 0
    model = CharTransformer(vocab_size=data.num_classes, seq_len=80, d_model=16, num_layers=1, num_heads=2, d_ff=32)
    model.load_state_dict(torch.load(out))
    again = pretrain.evaluate(model, x[held][clean], y[held][clean])["loss_all_positions"]
    assert again == pytest.approx(min(losses), rel=1e-6)
    chunked = tmp_path / "b" / "base.pt"  # the best epoch survives stopping and continuing
    while not chunked.exists():
        pretrain.main(["--out", str(chunked), "--data-dir", str(data_dir), *args, "--minutes", "0"])
    a, b = torch.load(out), torch.load(chunked)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit) as exit_:  # a bad share: one line (argparse's error), before any step
        pretrain.main(["--out", str(tmp_path / "c" / "base.pt"), "--data-dir", str(data_dir), *TINY, "--val-fraction", "1.5"])
    assert exit_.value.code == 2 and not (tmp_path / "c" / "base.pt.train.pt").exists()
    assert "--val-fraction: must be in (0, 1), got 1.5" in capsys.readouterr().err


def test_lora_shakespeare_config_runs_over_a_pretrained_base(tmp_path, data_dir):
    from conftest import REPO

    pretrain = _pretrain([])
    base = tmp_path / "base.pt"
    pretrain.main(["--out", str(base), "--data-dir", str(data_dir), *TINY])
    model = ["--model.net.init_args.net.init_args.d_model=16", "--model.net.init_args.net.init_args.num_layers=1",
             "--model.net.init_args.net.init_args.num_heads=2", "--model.net.init_args.net.init_args.d_ff=32"]
    cli = fit(REPO / "configs" / "lora_shakespeare.yaml", *model, f"--model.net.init_args.base_checkpoint={base}",
              f"--data.data_dir={data_dir}", "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--model.training.local_steps=2",
              "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--checkpoint_every=0",
              f"--trainer.default_root_dir={tmp_path}")
    lora = cli.model.net
    pretrained = torch.load(base)
    assert torch.equal(lora.base_layer("blocks.0.attn.qkv").weight.float(), pretrained["blocks.0.attn.qkv.weight"])
    assert cli.model.layout.num_params == sum(p.numel() for n, p in lora.named_parameters() if ".lora_" in n)
    assert len(cli.model.eval_history) == 1
    logged = cli.trainer.callback_metrics  # token inputs: each role's perplexity on its held-out text too
    assert float(logged["client/perplexity_worst10pct"]) >= float(logged["client/perplexity_mean"]) > 1


def test_pretrained_loads_a_base_for_full_fine_tuning_or_under_frozen_parts(tmp_path):
    from lfed.models.adapters import Pretrained

    torch.manual_seed(0)
    pretrained = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    path = tmp_path / "base.pt"
    torch.save(pretrained.state_dict(), path)
    full = Pretrained(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), str(path))
    with pytest.raises(RuntimeError, match="not loaded yet"):
        full(torch.randn(1, 4))
    full.load_pretrained()
    x = torch.randn(5, 4)
    assert torch.equal(full(x), pretrained(x))
    assert ParamLayout.from_module(full).num_params == 4 * 3 + 3 + 3 * 2 + 2  # nothing frozen
    head_only = Pretrained(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), str(path), freeze=["0.*"])
    assert ParamLayout.from_module(head_only).names == ("net.2.weight", "net.2.bias") and head_only.frozen == ["0.bias", "0.weight"]
    with pytest.raises(ValueError, match=r"freeze: pattern 'x\.\*' matches no parameter of Sequential"):
        Pretrained(nn.Sequential(nn.Linear(4, 3)), str(path), freeze=["x.*"])
    with pytest.raises(ValueError, match=r"does not fit Sequential: unexpected: 2.weight, 2.bias"):
        Pretrained(nn.Sequential(nn.Linear(4, 3)), str(path)).load_pretrained()
