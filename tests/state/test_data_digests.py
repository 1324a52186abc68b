"""The data's fingerprint hashed once, and a checkpoint that keeps a digest of the clients' sizes, not the sizes (issue 65).

Before, every save and every resume SHA-256-hashed the training labels and every index tensor twice
(``run_fingerprint`` and ``FederatedDataset.state_dict``), and the data module's checkpoint entry held
``client_sizes [N]`` (8 bytes a client: the whole checkpoint at 10^7 clients).
"""

from __future__ import annotations

import hashlib
import io
import pickle

import pytest
import torch

import lfed.state.fingerprint as F
from lfed.data.federated import FederatedDataset
from lfed.state.fingerprint import ResumeWarning, data_fingerprint, tensor_bytes, tensor_digest


def _dataset(num_clients: int = 20, **kw) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    n = max(40 * num_clients, 400)
    x, y = torch.randn(n + 50, 3, generator=g), torch.randint(0, 5, (n + 50,), generator=g)
    return FederatedDataset.from_tensors(x[:n], y[:n], x[n:], y[n:], num_clients=num_clients, partition="dirichlet",
                                         rho=0.5, holdout_fraction=0.2, num_classes=5, **kw)


def _old_digest(*tensors: torch.Tensor) -> str:
    """lfed 0.5's tensor_digest (bytes copied out first)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()[:16]


def test_tensor_digest_is_the_old_one_without_the_copy():
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(5, 7, generator=g), torch.randn(4, 6, generator=g).t(),  # non-contiguous
             torch.randn(9, generator=g).to(torch.bfloat16), torch.rand(8, generator=g) > 0.5,
             torch.zeros(0, 3, dtype=torch.long), torch.tensor(3.5), torch.arange(10)[::3]]
    for t in cases:
        assert tensor_digest(t) == _old_digest(t), t.dtype
    assert tensor_digest(*cases) == _old_digest(*cases)


@pytest.mark.parametrize("client_validation", [0.0, 0.25])
def test_the_fingerprint_hashes_once_and_records_what_it_recorded_before(monkeypatch, client_validation):
    dm = _dataset(client_validation_fraction=client_validation)
    d = dm.build()
    calls = []
    real = F.tensor_digest
    monkeypatch.setattr(F, "tensor_digest", lambda *t: calls.append(len(t)) or real(*t))
    first = data_fingerprint(dm)
    hashed = len(calls)
    assert hashed == (4 if client_validation else 3)  # labels, the indices, the sizes (, the clients' validation)
    state = dm.state_dict()
    dm.load_state_dict(state)
    assert data_fingerprint(dm) == first and dm.state_dict() == state
    assert len(calls) == hashed, "a save or a resume hashed the data again"
    # the labels and sizes as lfed 0.5 recorded them; the clients' positions flat since 0.6 (CSR: never N x max n_k)
    assert first["data.train_labels_hash"] == _old_digest(d.train_y)
    assert first["data.client_indices_hash"] == _old_digest(d.client_sizes, d.client_flat, d.holdout_sizes, d.holdout_flat)
    if client_validation:
        assert first["data.client_val_hash"] == _old_digest(d.client_val_sizes, d.client_val_flat)
    assert state["client_sizes_digest"] == _old_digest(d.client_sizes)
    # a checkpoint of lfed 0.5 recorded them over the padded indices: it still resumes (they are computed to compare),
    padded = {"data.client_indices_hash": _old_digest(d.client_sizes, d.client_index, d.holdout_sizes, d.holdout_index)}
    if client_validation:
        padded["data.client_val_hash"] = _old_digest(d.client_val_sizes, d.client_val_index)
    assert padded["data.client_indices_hash"] != first["data.client_indices_hash"]
    dm.load_state_dict({**state, "fingerprint": {**state["fingerprint"], **padded}})
    for key in padded:  # and one of another split is still refused, naming the key
        with pytest.raises(ValueError, match=key.replace(".", r"\.") + ": checkpoint"):
            dm.load_state_dict({**state, "fingerprint": {**state["fingerprint"], key: "0" * 16}})


def test_data_changed_after_the_build_is_hashed_again():
    """The cache never describes other contents: a tensor written in place, or replaced, is hashed anew."""
    dm = _dataset()
    d = dm.build()
    before = data_fingerprint(dm)
    d.train_y[0] = (d.train_y[0] + 1) % 5  # in place: torch counts the write
    after = data_fingerprint(dm)
    assert after["data.train_labels_hash"] != before["data.train_labels_hash"]
    assert after["data.train_labels_hash"] == tensor_digest(d.train_y)
    d.client_index = d.client_index.flip(1)  # another tensor
    assert data_fingerprint(dm)["data.client_indices_hash"] == tensor_digest(d.client_sizes, d.client_flat,
                                                                              d.holdout_sizes, d.holdout_flat)
    assert data_fingerprint(dm)["data.client_indices_hash"] != after["data.client_indices_hash"]


def _saved_bytes(state: dict) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.tell()


def test_the_checkpoint_entry_holds_no_per_client_array():
    small, large = _dataset(10).state_dict(), _dataset(2000).state_dict()
    assert not any(isinstance(v, torch.Tensor) for v in large.values())
    assert set(large) == {"num_clients", "client_sizes_digest", "seed", "partition", "fingerprint"}
    assert large["num_clients"] == 2000
    assert _saved_bytes(large) - _saved_bytes(small) < 64  # a constant, whatever N (was 8 bytes a client)
    pickle.dumps(large)  # plain values


def test_a_checkpoint_of_lfed_0_5_with_its_sizes_array_still_loads_and_is_checked():
    dm = _dataset()
    d = dm.build()
    old = {k: v for k, v in dm.state_dict().items() if k != "client_sizes_digest"}
    old["client_sizes"] = d.client_sizes.clone()  # what lfed 0.5 stored
    dm.load_state_dict(old)  # the same split: loads
    other = d.client_sizes.clone()
    other[0] += 1
    with pytest.raises(ValueError, match="data.client_sizes_digest: checkpoint"):
        dm.load_state_dict({**old, "client_sizes": other})


def test_other_sizes_are_refused_by_their_digest():
    dm = _dataset()
    with pytest.raises(ValueError, match="data.client_indices_hash"):  # another seed: other indices, as before
        dm.load_state_dict(_dataset(seed=1).state_dict())
    state = dm.state_dict()
    with pytest.raises(ValueError, match="data.client_sizes_digest: checkpoint 'x'"):
        dm.load_state_dict({**state, "client_sizes_digest": "x"})
    with pytest.warns(ResumeWarning, match="no lfed run fingerprint"):  # nothing to compare with: as before
        dm.load_state_dict({"num_clients": 20})
