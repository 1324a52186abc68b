"""Placements of per-client state (lfed.state.stores): device, host, disk.

Every placement must give the same run bit for bit (float64, CPU, both backends): the global
model and the whole state dict (whose per-client entries are the same sparse
``{clients, rows, shape}`` in every placement) after several rounds of SCAFFOLD with stragglers,
IGFL-C with time attention, EFL with compression and stragglers, and FedDyn. A checkpoint
written under one placement resumes under another to the state of a straight run. Rows of
clients that never took part read as the declared initial value and take no memory; a ``disk``
state file that is missing or truncated, and a checkpoint whose sparse entries are broken, give
clear errors naming the file or the entry.
"""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from lightning.pytorch import Trainer
from torch import nn

from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.state.spec import StateSpec
from lfed.state.stores import ClientStateFileError, ClientStateStore, dense_rows

PLACEMENTS = ["device", "host", "disk"]
N = 12

CASES = {
    "scaffold": dict(algorithm="scaffold", fraction=0.25, stragglers=dict(p_incomplete=0.5)),
    "igfl_time": dict(algorithm="igfl", objective="igfl", combination="time", fraction=0.25, stragglers=dict(p_inactive=0.3)),
    # the objective as a config gives it: each module builds its own EFL
    "efl": dict(algorithm="efl", channel=0.5, fraction=0.25, stragglers=dict(p_incomplete=0.5, p_inactive=0.2),
                objective={"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 4}}),
    "feddyn": dict(algorithm="feddyn", fraction=0.25),
}


def data() -> FederatedDataModule:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N * 6, 4, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return FederatedDataModule.from_tensors(x, y, x[:20], y[:20], num_clients=N, partition="iid",
                                            holdout_fraction=0.0, num_classes=3, seed=1)


def module(case: str, placement: str, backend: str = "vmap", tmp_path=None, **extra) -> FederatedModule:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()  # (a float32 net resumed under 64-true is not exact)
    engine = dict(backend=backend, client_state=placement)
    if placement == "disk" and tmp_path is not None:
        engine["client_state_dir"] = str(tmp_path / "state")
    kwargs = dict(CASES[case], training=dict(client_lr=0.1, batch_size=3, local_epochs=1), engine=engine, seed=2)
    kwargs.update(extra)
    return FederatedModule(net, **kwargs)


def _same_state(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        assert torch.equal(a[key].cpu(), b[key].cpu()), f"{what}: {key}"


@pytest.mark.parametrize("backend", ["vmap", "loop"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_placement_gives_the_device_run_bit_for_bit(case, backend, tmp_path):
    runs = {}
    for placement in PLACEMENTS:
        m = module(case, placement, backend, tmp_path)
        run_rounds(m, data(), rounds=5, default_root_dir=tmp_path)
        runs[placement] = (flat_weights(m).detach().clone(), m.state_dict(), m)
    w0, s0, m0 = runs["device"]
    lazy = [k.removesuffix(".rows") for k in s0 if k.endswith(".rows")]
    assert lazy, "the case keeps per-client rows"
    for key in lazy:  # the state is not trivially empty: some clients have rows, not all of them
        assert 0 < s0[f"{key}.clients"].numel() < N, key
        assert s0[f"{key}.rows"].abs().sum() > 0, key
        # the device buffer agrees with its sparse entries (rows of clients never written are zeros)
        owner, name = key.split(".")
        torch.testing.assert_close(dense_rows(s0, key), getattr(m0, owner)._buffers[name], atol=0, rtol=0)
    for placement in ("host", "disk"):
        w, s, m = runs[placement]
        assert torch.equal(w, w0), placement
        _same_state(s0, s, f"{case}/{backend}: {placement} vs device")
        assert m.store.describe() == m0.store.describe()


def test_lazy_rows_read_the_initial_value_and_grow_with_participants(tmp_path):
    """N = 100,000 clients of P = 1,000: writing 10 rows holds ~10 rows, not N; others read init."""
    big_n, P = 100_000, 1000
    for placement in ("host", "disk"):
        store = ClientStateStore(placement, tmp_path / placement)
        owner = nn.Module()
        specs = [StateSpec("c"), StateSpec("half", init=0.5), StateSpec("score", shape=(), init=lambda n: n.double() / n.sum(),
                                                                         dtype=torch.float64)]
        store.register_owner("objective", owner)
        store.allocate(owner, specs, torch.ones(big_n, dtype=torch.long), P, torch.zeros((), dtype=torch.float32))
        clients = torch.tensor([5, 99_999, 17])
        assert torch.equal(store.rows(owner, "c", clients), torch.zeros(3, P))
        assert torch.equal(store.rows(owner, "half", clients), torch.full((3, P), 0.5))
        before = store.nbytes()["objective.c"]
        assert before == 8 * big_n  # the index only: no row yet
        written = torch.arange(10) * 7
        values = torch.randn(10, P)
        store.write_rows(owner, "c", written, values)
        got = store.rows(owner, "c", torch.tensor([0, 1, 63, 7]))
        assert torch.equal(got, torch.stack([values[0], torch.zeros(P), values[9], values[1]]))
        assert store.nbytes()["objective.c"] <= before + 16 * P * 4  # at most 16 rows allocated
        assert torch.equal(store.participants(owner, "c"), written)
        # a masked write gives rows only to the selected clients
        store.write_rows(owner, "half", torch.tensor([1, 2]), torch.ones(2, P), mask=torch.tensor([False, True]))
        assert torch.equal(store.participants(owner, "half"), torch.tensor([2]))
        assert torch.equal(store.rows(owner, "half", torch.tensor([1])), torch.full((1, P), 0.5))
        # a per-client spec without "P" (and a callable init) stays a dense buffer
        assert owner.score.shape == (big_n,) and float(owner.score[0]) == 1 / big_n
        with pytest.raises(RuntimeError, match=f"client_state='{placement}' keeps these rows off the device"):
            store.get(owner, "c")
        store.close()


@pytest.mark.parametrize("placement", ["host", "disk"])
def test_rows_agree_with_a_dense_reference_through_many_growths(placement, tmp_path):
    """Random cohorts (clients seen before and new ones) over 40 rounds, the row storage growing
    from 16 rows to 512 (``host``: in blocks, rows never moved; ``disk``: the file extended in
    place): every read equals a dense ``[N, P]`` tensor written the same way, and so does the
    state dict's sparse entry."""
    n, P = 500, 7
    store = ClientStateStore(placement, tmp_path)
    owner = nn.Module()
    store.register_owner("o", owner)
    store.allocate(owner, [StateSpec("c")], torch.ones(n, dtype=torch.long), P, torch.zeros((), dtype=torch.float64))
    ref = torch.zeros(n, P, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        clients = torch.randperm(n, generator=g)[: int(torch.randint(1, 40, (1,), generator=g))]
        assert torch.equal(store.rows(owner, "c", clients), ref[clients])
        values = torch.randn(len(clients), P, generator=g, dtype=torch.float64)
        store.write_rows(owner, "c", clients, values)
        ref[clients] = values
    rows = store._rows[(id(owner), "c")]
    assert rows.capacity >= 256 and rows.count == int((ref != 0).any(1).sum())
    if placement == "host":
        assert len(rows.blocks) >= 5  # grown in blocks: 16, 16, 32, 64, 128, ...
    assert torch.equal(store.rows(owner, "c", torch.arange(n)), ref)
    assert torch.equal(store.rows(owner, "c", torch.arange(n).flip(0)), ref.flip(0))
    assert torch.equal(dense_rows(owner.state_dict(), "c"), ref)
    store.close()


def _trainer(root, rounds, **kwargs):
    return Trainer(max_steps=rounds, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   precision="64-true", check_val_every_n_epoch=None, val_check_interval=rounds,
                   limit_val_batches=0, default_root_dir=root, **kwargs)


@pytest.mark.parametrize("first,then", [("device", "host"), ("host", "disk"), ("disk", "device"), ("disk", "disk")])
@pytest.mark.parametrize("case", ["scaffold", "efl"])
def test_checkpoint_under_one_placement_resumes_under_another(case, first, then, tmp_path):
    straight = module(case, "device")
    run_rounds(straight, data(), rounds=4, default_root_dir=tmp_path)
    a = module(case, first, tmp_path=tmp_path)
    trainer = _trainer(tmp_path, 2)
    trainer.fit(a, datamodule=data())
    trainer.save_checkpoint(tmp_path / "r2.ckpt")
    ckpt = torch.load(tmp_path / "r2.ckpt", weights_only=True)
    assert any(k.endswith(".clients") for k in ckpt["state_dict"])
    b = module(case, then, tmp_path=tmp_path)
    _trainer(tmp_path, 4).fit(b, datamodule=data(), ckpt_path=tmp_path / "r2.ckpt")
    assert torch.equal(flat_weights(b), flat_weights(straight))
    _same_state(straight.state_dict(), b.state_dict(), f"{first} -> {then}")


def test_the_dense_format_of_older_checkpoints_still_loads(tmp_path):
    a = module("scaffold", "device")
    run_rounds(a, data(), rounds=3, default_root_dir=tmp_path)
    sparse = a.state_dict()
    legacy = {k: v for k, v in sparse.items() if not k.startswith("objective.client_control.")}
    legacy["objective.client_control"] = dense_rows(sparse, "objective.client_control")
    for placement in PLACEMENTS:
        b = module("scaffold", placement, tmp_path=tmp_path)
        _trainer(tmp_path, 1).fit(b, datamodule=data())  # allocates the state (then replaced by the load)
        b.load_state_dict(legacy)
        _same_state(sparse, b.state_dict(), placement)


def _fitted(placement, tmp_path, rounds=2):
    m = module("scaffold", placement, tmp_path=tmp_path)
    run_rounds(m, data(), rounds=rounds, default_root_dir=tmp_path)
    return m


def test_missing_or_truncated_state_file_names_the_file(tmp_path):
    m = _fitted("disk", tmp_path)
    rows = m.store._rows[(id(m.objective), "client_control")]
    path = rows.path
    assert path.is_file() and path.parent.parent == tmp_path / "state"
    clients = torch.tensor([0, 1])
    m.objective.rows("client_control", clients)  # readable
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(ClientStateFileError, match=f"state file {path} of objective.client_control was replaced or changed size"):
        m.objective.rows("client_control", clients)
    path.unlink()
    with pytest.raises(ClientStateFileError, match=f"state file {path} of objective.client_control is missing"):
        m.objective.write_rows("client_control", clients, torch.zeros(2, m.layout.num_params, dtype=torch.float64))
    with pytest.raises(ClientStateFileError, match=str(path)):
        m.state_dict()  # a checkpoint is not written from a broken file


def test_disk_files_are_removed_with_the_store(tmp_path):
    m = _fitted("disk", tmp_path)
    run_dir = m.store._rows[(id(m.objective), "client_control")].path.parent
    assert run_dir.is_dir()
    m.store.close()
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda sd: sd.pop("objective.client_control.rows"), r"objective.client_control is incomplete: .* not objective.client_control.rows"),
        (lambda sd: sd.__setitem__("objective.client_control.clients", sd["objective.client_control.clients"] + N),
         r"objective.client_control.clients: client ids must be distinct and in \[0, 12\)"),
        (lambda sd: sd.__setitem__("objective.client_control.rows", sd["objective.client_control.rows"][:, :-1]),
         r"objective.client_control.rows: shape .* does not match"),
        (lambda sd: sd.__setitem__("objective.client_control.shape", torch.tensor([N + 1, 43])),
         r"objective.client_control has shape \(13, 43\) in the checkpoint but \(12, 43\) in this run"),
    ],
)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_broken_sparse_entries_are_refused_naming_them(placement, edit, match, tmp_path):
    sd = dict(_fitted("device", tmp_path).state_dict())
    edit(sd)
    m = module("scaffold", placement, tmp_path=tmp_path)
    _trainer(tmp_path, 1).fit(m, datamodule=data())
    with pytest.raises(ValueError, match=match):
        m.load_state_dict(sd)


def test_missing_sparse_entries_are_missing_keys(tmp_path):
    sd = {k: v for k, v in _fitted("device", tmp_path).state_dict().items() if not k.startswith("objective.client_control.")}
    m = module("scaffold", "host")
    _trainer(tmp_path, 1).fit(m, datamodule=data())
    with pytest.raises(RuntimeError, match="Missing key.*objective.client_control.rows"):
        m.load_state_dict(sd)


def test_bad_placement_arguments_fail_early():
    with pytest.raises(ValueError, match=r"client_state: 'gpu' is not one of \('device', 'host', 'disk'\)"):
        FederatedModule(nn.Linear(2, 2), engine=dict(client_state="gpu"))
    with pytest.raises(ValueError, match="client_state_dir: only used with client_state='disk'"):
        FederatedModule(nn.Linear(2, 2), engine=dict(client_state="host", client_state_dir="x"))
