"""Job 2 in Apple's pfl: FedAvg, MNIST, lfed's 100 shard clients, 10 per round, E = 1, B = 10, lr 0.05.

Written as pfl's own PyTorch benchmark (``benchmarks/image_classification/pytorch/train.py`` in
pfl-research) sets it up: ``PyTorchModel`` with ``torch.optim.SGD`` locally and SGD(lr = 1) as the
central optimizer, ``SimulatedBackend`` with ``WeightByDatapoints``, ``FederatedAveraging`` and
``NNAlgorithmParams``. Configured for speed as pfl's docs recommend for one process: the whole
dataset in memory as torch tensors (``PyTorchTensorDataset`` users, no DataLoader, no numpy
conversion per batch), no per-user evaluation (``evaluation_frequency`` = all rounds, so only
round 0's cohort is evaluated, as pfl always does at iteration 0) and no validation cohort, and one
central test evaluation after the last round. Users are sampled with pfl's ``minimize_reuse``
sampler (each round 10 distinct users); each user's examples are reshuffled every time it is
drawn (pfl walks a user's data in order).

    /tmp/bench_pfl/bin/python benchmarks/peers/pfl_job.py --data /tmp/lfed_peers --rounds 50
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import MLP, harness, load_arrays, report, test_accuracy  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.aggregate.weighting import WeightByDatapoints  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.pytorch import PyTorchTensorDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class PflMLP(MLP):
    """The 2NN with the ``loss`` and ``metrics`` methods pfl's PyTorchModel calls."""

    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's signature
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # noqa: A002
        self.eval()
        out = self(x)
        n = len(y)
        return {"loss": Weighted(float(F.cross_entropy(out, y, reduction="sum")), n),
                "accuracy": Weighted(float((out.argmax(-1) == y).sum()), n)}


class Clock(TrainingProcessCallback):
    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_train_begin(self, *, model):
        self.marks.append(harness.clock())
        return super().on_train_begin(model=model)

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.marks.append(harness.clock())
        return False, type(aggregate_metrics)()


def main() -> None:
    p = harness.parser(__doc__, quick=False)
    p.add_argument("--data", required=True, help="folder written by peers_mnist.py")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dp-noise", type=float, default=None,
                   help="central DP as pfl sets it up: GaussianMechanism (clip, z) from an RDP accountant, applied centrally")
    p.add_argument("--dp-clip", type=float, default=0.5)
    p.add_argument("--dp-delta", type=float, default=None, help="default 1/N^1.1, lfed's default")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    a = load_arrays(args.data)
    train_x, train_y = torch.from_numpy(a["train_x"]), torch.from_numpy(a["train_y"]).long()
    users = [(train_x[ids], train_y[ids]) for ids in torch.from_numpy(a["partition"])]

    def make_user(uid):
        x, y = users[uid]
        perm = torch.randperm(x.shape[0])
        return PyTorchTensorDataset((x[perm], y[perm]), user_id=uid)

    train_data = FederatedDataset(make_user, get_user_sampler("minimize_reuse", list(range(len(users)))))
    net = PflMLP()
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD([q for q in net.parameters() if q.requires_grad], lr=1.0))
    postprocessors, dp = [WeightByDatapoints()], {}
    if args.dp_noise is not None:  # pfl's central DP: uniform weights, clip each user, noise N(0, (zC)^2) on the sum
        from pfl.aggregate.weighting import WeightByUser
        from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism, RDPPrivacyAccountant

        q = args.cohort / len(users)
        delta = args.dp_delta if args.dp_delta is not None else len(users) ** -1.1
        accountant = RDPPrivacyAccountant(num_compositions=args.rounds, sampling_probability=q, mechanism="gaussian",
                                          noise_parameter=args.dp_noise, delta=delta)
        mechanism = CentrallyAppliedPrivacyMechanism(GaussianMechanism.from_privacy_accountant(accountant, args.dp_clip))
        postprocessors = [WeightByUser(), mechanism]
        dp = {"epsilon": accountant.epsilon, "delta": delta}
    backend = SimulatedBackend(training_data=train_data, val_data=None, postprocessors=postprocessors)
    clock = Clock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=args.rounds, evaluation_frequency=args.rounds,
                                           train_cohort_size=args.cohort, val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=args.lr, local_num_epochs=args.epochs,
                                              local_batch_size=args.batch_size),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[clock],
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun every worker holds the same central model
        return
    acc = test_accuracy(net, torch.from_numpy(a["test_x"]), torch.from_numpy(a["test_y"]).long())
    import pfl

    report("pfl_dp" if dp else "pfl", T_START, clock.marks, acc, version=pfl.__version__, **dp)


if __name__ == "__main__":
    main()
