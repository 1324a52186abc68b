"""A user's loss in any form trains the same: a batch-mean function equals its per-example module.

The engine pads a client's last mini-batch when ``B`` does not divide ``n_k`` and masks the padding
out of the mean; a plain function that reduces the batch itself (``F.cross_entropy``) must not let
the padded rows into the mean.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import flat_weights, run_rounds
from torch import nn

from lfed import FederatedDataModule, FederatedModule
from lfed.engine import as_per_example_loss


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (90,), generator=g)
    # 6 clients of 13 examples: B = 5 leaves a partial last batch of 3 (2 padded rows)
    return FederatedDataModule.from_tensors(x[:78], y[:78], x[78:], y[78:], num_clients=6, partition="iid",
                                            holdout_fraction=0.0, seed=0)


def _train(loss, backend):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    module = FederatedModule(net, loss=loss, fraction=0.5, training=dict(client_lr=0.3, batch_size=5), engine=dict(backend=backend), seed=1)
    run_rounds(module, _data(), 2)
    return flat_weights(module)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
@pytest.mark.parametrize("loss", [F.cross_entropy, lambda out, y: F.cross_entropy(out, y, reduction="sum")],
                         ids=["mean-function", "sum-lambda"])
def test_a_batch_reducing_loss_function_trains_as_the_per_example_module(loss, backend):
    expected = _train(nn.CrossEntropyLoss(), backend)
    torch.testing.assert_close(_train(loss, backend), expected, rtol=0, atol=1e-12)


def test_per_example_wrapper_by_hand():
    out = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    by_hand = torch.tensor([-torch.log_softmax(out[i], 0)[y[i]] for i in range(3)], dtype=torch.float64)
    torch.testing.assert_close(as_per_example_loss(F.cross_entropy)(out, y), by_hand, rtol=0, atol=1e-15)
    torch.testing.assert_close(as_per_example_loss(lambda o, t: F.cross_entropy(o, t, reduction="none"))(out, y),
                               by_hand, rtol=0, atol=1e-15)
