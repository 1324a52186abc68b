"""Job 2 in Flower's simulation (Ray backend): FedAvg, MNIST, lfed's 100 shard clients, 10 per round.

Flower's Message API as its PyTorch quickstart writes it (``ServerApp`` with
``flwr.serverapp.strategy.FedAvg``, a ``ClientApp`` with ``@app.train()``), run with
``flwr.simulation.run_simulation`` on the Ray backend. Configured for speed as Flower's
simulation guide recommends: ``client_resources`` sized so that as many ClientApps run at once as
there are cores (``num_cpus = 1`` each, no GPU), each Ray actor keeps its data and model between
rounds (module-level caches), local training on in-memory tensors (no DataLoader), no federated
evaluation (``fraction_evaluate = 0``), and one centralised test evaluation after the last round
(``evaluate_fn``, which Flower also calls before round 1 and after every round: those calls
time the rounds).

    /tmp/bench_flwr/bin/python benchmarks/peers/flower_job.py --data /tmp/lfed_peers --rounds 50
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import MLP, harness, load_arrays, local_sgd, report, test_accuracy  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

_CACHE: dict = {}  # per process (each Ray actor): the data and one model


def _client_data(data: str, pid: int, threads: int) -> tuple[torch.Tensor, torch.Tensor]:
    if "arrays" not in _CACHE:
        torch.set_num_threads(threads)  # the ClientApp's cores (client_resources num_cpus)
        _CACHE["arrays"] = load_arrays(data)
        _CACHE["model"] = MLP()
    a = _CACHE["arrays"]
    ids = a["partition"][pid]
    return torch.from_numpy(a["train_x"][ids]), torch.from_numpy(a["train_y"][ids]).long()


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content["config"]
    x, y = _client_data(str(cfg["data"]), int(context.node_config["partition-id"]), int(cfg["threads"]))
    model = _CACHE["model"]
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss = local_sgd(model, x, y, float(cfg["lr"]), int(cfg["epochs"]), int(cfg["batch-size"]))
    content = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"train_loss": loss, "num-examples": int(x.shape[0])}),
    })
    return Message(content=content, reply_to=msg)


server = ServerApp()
RUN: dict = {"marks": [], "acc": None}


@server.main()
def main_server(grid: Grid, context: Context) -> None:
    args = RUN["args"]
    arrays = load_arrays(args.data)
    test_x, test_y = torch.from_numpy(arrays["test_x"]), torch.from_numpy(arrays["test_y"]).long()
    torch.manual_seed(args.seed)
    model = MLP()
    num_clients = arrays["partition"].shape[0]

    def evaluate_fn(server_round: int, rec: ArrayRecord) -> MetricRecord | None:
        RUN["marks"].append(harness.clock())  # round 0: before round 1; r: after round r
        if server_round < args.rounds:
            return None
        model.load_state_dict(rec.to_torch_state_dict())
        RUN["acc"] = test_accuracy(model, test_x, test_y)
        return MetricRecord({"accuracy": RUN["acc"]})

    strategy = FedAvg(
        fraction_train=args.fraction, fraction_evaluate=0.0, min_train_nodes=1, min_evaluate_nodes=0,
        min_available_nodes=num_clients,
    )
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=args.rounds,
        train_config=ConfigRecord({"lr": args.lr, "epochs": args.epochs, "batch-size": args.batch_size, "data": os.path.abspath(args.data),
                                  "threads": max(1, int(args.cpus_per_client))}),
        evaluate_fn=evaluate_fn,
    )


def main() -> None:
    p = harness.parser(__doc__, quick=False)
    p.add_argument("--data", required=True, help="folder written by peers_mnist.py")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpus-per-client", type=float, default=1.0)
    args = p.parse_args()
    RUN["args"] = args
    num_clients = int(np.load(os.path.join(args.data, "partition.npy"), mmap_mode="r").shape[0])
    run_simulation(
        server_app=server, client_app=client, num_supernodes=num_clients,
        backend_config={"client_resources": {"num_cpus": args.cpus_per_client, "num_gpus": 0.0}},
    )
    # marks[0] is the evaluate_fn call before round 1; the last one includes the final test evaluation
    marks = RUN["marks"]
    import flwr

    report("flower", T_START, marks, RUN["acc"], version=flwr.__version__, backend="ray",
           cpus_per_client=args.cpus_per_client)


if __name__ == "__main__":
    main()
