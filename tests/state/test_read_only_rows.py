"""Rows read without a copy (issue 39): under :func:`lfed.state.spec.read_only_rows` a dense state answers a
contiguous range of clients with a view of itself, host and disk rows stored in consecutive slots too (else they
go through one reused buffer), and
a row that starts as the global model is returned as read once every client of the range has started.
Outside the context every read is a copy, as before. The personalized evaluation of every client reads
its rows this way and gives the same accuracies as a by-hand loop in every placement."""

from __future__ import annotations

import pytest
import torch
from conftest import flat_weights, run_rounds
from test_evaluation import accuracy_by_hand, classification_data, classification_module
from torch import nn

from lfed.base.component import Component
from lfed.engine.ranks import Ranks
from lfed.personal.ditto import Ditto
from lfed.state.spec import GLOBAL, ModuleStateStore, StateSpec, client_range, read_only_rows
from lfed.state.stores import ClientStateStore

N, P = 9, 5


def test_client_range_is_read_on_the_cpu_only_for_consecutive_ids():
    assert client_range(torch.arange(3, 7)) == (3, 7)
    assert client_range(torch.tensor([4])) == (4, 5)
    assert client_range(torch.tensor([0, 2, 3])) is None
    assert client_range(torch.tensor([3, 2, 1, 0])) is None  # ends span 4 but descending
    assert client_range(torch.tensor([0, 2, 1, 3])) is None  # ends span 4 but not in order
    assert client_range(torch.tensor([], dtype=torch.long)) is None
    assert client_range(torch.arange(4).view(2, 2)) is None


def _store(kind: str, tmp_path):
    store = ModuleStateStore() if kind == "module" else ClientStateStore(kind, tmp_path)
    owner = nn.Module()
    store.register_owner("o", owner)
    store.allocate(owner, [StateSpec("c")], torch.ones(N, dtype=torch.long), P, torch.zeros((), dtype=torch.float64))
    values = torch.randn(N, P, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    store.write_rows(owner, "c", torch.arange(N), values)
    return store, owner, values


@pytest.mark.parametrize("kind", ["module", "device", "host", "disk"])
def test_rows_under_the_context_equal_the_copies_and_share_storage_where_they_can(kind, tmp_path):
    store, owner, values = _store(kind, tmp_path)
    outside = store.rows(owner, "c", torch.arange(2, 6))
    assert torch.equal(outside, values[2:6])
    with read_only_rows():
        first = store.rows(owner, "c", torch.arange(2, 6))
        assert torch.equal(first, values[2:6])
        ptr = first.data_ptr()
        second = store.rows(owner, "c", torch.arange(5, 8))
        assert torch.equal(second, values[5:8])
        scattered = store.rows(owner, "c", torch.tensor([8, 0, 4]))
        assert torch.equal(scattered, values[[8, 0, 4]])
        scattered_ptr = scattered.data_ptr()
        again_scattered = store.rows(owner, "c", torch.tensor([7, 1]))
        assert torch.equal(again_scattered, values[[7, 1]])
    if kind in ("module", "device"):  # a view of the dense state: no copy
        buf = owner._buffers["c"]
        assert ptr == buf[2].data_ptr() and second.data_ptr() == buf[5].data_ptr()
    else:  # consecutive slots are a view of the stored block (no gather); others go through one reused buffer
        assert second.data_ptr() - ptr == 3 * P * values.element_size()
        assert again_scattered.data_ptr() == scattered_ptr
    # outside the context a read is a copy again: writing into it leaves the state alone
    again = store.rows(owner, "c", torch.arange(2, 6))
    again.add_(1.0)
    assert torch.equal(store.rows(owner, "c", torch.arange(2, 6)), values[2:6])
    if kind != "module":
        store.close()


class _Personal(Component):
    def state_specs(self):
        return (StateSpec("v", init=GLOBAL),)


@pytest.mark.parametrize("kind", ["module", "device", "host"])
def test_rows_that_start_as_the_global_model_read_it_until_written_also_in_place(kind, tmp_path):
    store = ModuleStateStore() if kind == "module" else ClientStateStore(kind, tmp_path)
    comp = _Personal()
    store.register_owner("o", comp)
    comp.setup_state(store, torch.ones(N, dtype=torch.long), P, torch.zeros((), dtype=torch.float64))
    w = torch.full((P,), -1.0, dtype=torch.float64)
    values = torch.randn(4, P, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    comp.write_rows("v", torch.arange(2, 6), values)  # clients 2..5 started, the others read w
    with read_only_rows():
        part = comp.rows("v", torch.arange(1, 4), first=w)  # 1 not started: w; 2, 3 their rows
        assert torch.equal(part, torch.stack([w, values[0], values[1]]))
        every = comp.rows("v", torch.arange(2, 6), first=w)  # all started: their rows as read
        assert torch.equal(every, values)
    if kind in ("module", "device"):
        assert every.data_ptr() == comp._buffers["v"][2].data_ptr()  # in place: no where, no copy
    outside = comp.rows("v", torch.arange(2, 6), first=w)
    assert torch.equal(outside, values)
    if kind in ("module", "device"):
        assert outside.data_ptr() != comp._buffers["v"][2].data_ptr()
    if kind != "module":
        store.close()


@pytest.mark.parametrize("placement", ["device", "host", "disk"])
def test_every_clients_personal_model_scored_in_chunks_equals_a_loop_by_hand(placement, tmp_path):
    """Every client has a Ditto model of its own (written, so the rows are read in place or through the reused
    buffer), evaluated 2 clients per chunk: the accuracies equal a by-hand loop over clients, in every placement."""
    dm = classification_data()
    m = classification_module(Ditto(lam=0.2), evaluation=dict(personal_chunk=2),
                              engine=dict(client_state=placement, client_state_dir=str(tmp_path) if placement == "disk" else None))
    run_rounds(m, dm, rounds=1)
    data, run = m.data, m.runs[0]
    everyone = run.personal_sample()
    assert torch.equal(everyone, torch.arange(data.num_clients))
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(data.num_clients, m.layout.num_params, generator=g, dtype=torch.float64)
    m.objective.write_rows("personal", everyone, rows)
    run.personal_evaluation((run.client_accuracy(), None), Ranks(), lambda t: t, False, 2048)
    expected = torch.tensor([accuracy_by_hand(m.net, m.layout, rows[k], data, k) for k in everyone.tolist()],
                            dtype=torch.float64)
    assert torch.equal(run.last_personal["personal"], expected)
    # and the state is untouched by the reads
    assert torch.equal(m.objective.rows("personal", everyone, first=flat_weights(m)), rows)
