"""Scale out over Lightning's DDP (lfed.engine.ranks, docs/distributed.md).

Two kinds of tests:

* In one process: the pieces by hand (row assignment, padding and assembly, shares of a cohort
  trained one rank at a time equal the whole cohort, digests).
* Real ``lfed fit`` on 2 CPU processes (Gloo) against the same run on 1 process, for FedAvg,
  SCAFFOLD (with AdaFL sampling and DWFed weights), IGFL (attention server, loop backend) and EFL
  (Fisher reports, compression): the whole module state after 4 rounds (global model and every
  per-client tensor), the evaluations and the communication count agree, every rank holds
  bit-identical state after every round (ReplicaCheck), and the 2-process checkpoint of round 2
  resumes on 1 process to the same state.

Tolerance of the 1-vs-2-process comparison: the contract's float32 tolerance (``conftest.CROSS_MACHINE``,
docs/reproducibility.md: max|a - b| <= 1e-5 max|b| per tensor; it was ``rtol=1e-5, atol=1e-6``). A rank runs
the same per-client arithmetic as one process, only with fewer clients per vmap call, and the
gathered results cross the wire bit for bit; the ranks themselves are compared bit for bit
(ReplicaCheck). Against the one-process run the states agreed exactly (max difference 0.0) in
most runs here and by at most 1.5e-7 (one float32 ulp at the weights' scale) in one run on a
heavily loaded machine, where the one-process run's multi-threaded BLAS can pick another kernel.
The tolerance leaves room for that (a few ulps per step, amplified by 1/(steps * lr) ~ 7 in
SCAFFOLD's control variates), not for any real difference: drawing each rank's batch schedule
for its share only (instead of the whole cohort's) moves the FedAvg weights by up to 3.8e-3
after 4 rounds, and that mutant fails here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_within
from torch import nn

from lfed.client.fisher import FisherJob, fisher_diagonal, fisher_share
from lfed.engine import CohortTrainer, StepRule
from lfed.engine.ranks import (
    Ranks,
    TrainJob,
    assemble_rows,
    assign_rows,
    check_digests,
    pad_rows,
    state_digest,
    sum_over_ranks,
    train_cohort,
    train_share,
)
from lfed.lightning.cli import run_cli
from lfed.rng import round_generator


# ---------------------------------------------------------------------------- pieces by hand
def test_assign_rows_balances_work_greedily_longest_first():
    # work 5 1 4 2 3 -> take 5 (r0: 5), 4 (r1: 4), 3 (r1: 7), 2 (r0: 7), 1 (tie 7/7 -> r0: 8)
    parts = assign_rows(torch.tensor([5, 1, 4, 2, 3]), 2)
    assert [p.tolist() for p in parts] == [[0, 1, 3], [2, 4]]
    # three ranks: 5 -> r0, 4 -> r1, 3 -> r2, 2 -> r2 (3 < 4 < 5), 1 -> r1 (4 < 5, 5 = 5)
    assert [p.tolist() for p in assign_rows(torch.tensor([5, 1, 4, 2, 3]), 3)] == [[0], [1, 2], [3, 4]]


def test_assign_rows_leaves_ranks_empty_when_the_cohort_is_smaller():
    parts = assign_rows(torch.tensor([0, 2]), 3)
    assert [p.tolist() for p in parts] == [[1], [0], []]
    assert [p.tolist() for p in assign_rows(torch.tensor([3, 3, 3]), 1)] == [[0, 1, 2]]


@pytest.mark.parametrize(
    "work, world, match",
    [([1, 2], 0, "world_size: must be an int >= 1, got 0"), ([1, -1], 2, "work: must be >= 0"), ([[1]], 2, r"work: expected a \[K\]")],
)
def test_assign_rows_refuses_bad_input(work, world, match):
    with pytest.raises(ValueError, match=match):
        assign_rows(torch.tensor(work), world)


def test_share_splits_items_into_contiguous_ranges():
    assert [Ranks(r, 3).share(10) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert [Ranks(r, 2).share(1) for r in range(2)] == [(0, 0), (0, 1)]
    assert Ranks().share(7) == (0, 7) and not Ranks().distributed


def test_pad_and_assemble_rows_by_hand():
    parts = [torch.tensor([0, 3]), torch.tensor([1]), torch.tensor([], dtype=torch.long)]
    locals_ = [torch.tensor([[10.0], [13.0]]), torch.tensor([[11.0]]), torch.zeros(0, 1)]
    padded = [pad_rows(x, parts, r) for r, x in enumerate(locals_)]
    assert padded[1].tolist() == [[11.0], [0.0]] and padded[2].tolist() == [[0.0], [0.0]]
    # rows 0 and 3 from rank 0, row 1 from rank 1; row 2 belongs to nobody -> K = 3 rows only
    parts = [torch.tensor([0, 2]), torch.tensor([1]), torch.tensor([], dtype=torch.long)]
    out = assemble_rows(torch.stack([pad_rows(torch.tensor([[10.0], [12.0]]), parts, 0), padded[1], padded[2]]), parts)
    assert out.tolist() == [[10.0], [11.0], [12.0]]
    with pytest.raises(ValueError, match="local: rank 0 has 2 rows, got a tensor of 1"):
        pad_rows(torch.zeros(1, 1), parts, 0)


def _cohort(backend: str):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = torch.randn(60, 5, dtype=torch.float64), torch.randint(0, 3, (60,))
    index = torch.randperm(60).view(5, 12)
    n = torch.tensor([12, 7, 3, 10, 5])
    steps = torch.tensor([4, 0, 2, 3, 1])  # one inactive client, uneven work
    trainer = CohortTrainer(net, backend=backend)
    w0 = trainer.layout.module_vector(net)
    K, P = 5, w0.numel()
    rule = StepRule(grad_scale=torch.linspace(1.0, 1.5, K, dtype=torch.float64), decay=0.01,
                    shift=0.01 * torch.randn(K, P, dtype=torch.float64))  # per-client pieces must follow the rows
    # a fresh generator per call, as each rank makes its own from (seed, round, stream)
    return trainer, lambda: (w0, x, y, index, n, steps, rule, 0.1, 4, round_generator(3, 1, "batches"))


@pytest.mark.bitlevel
@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_shares_of_a_cohort_trained_rank_by_rank_equal_the_whole_cohort(backend, world, one_thread):
    """With one intra-op thread a rank's share (fewer rows per vmap call) is the whole cohort's rows bit for bit
    (docs/reproducibility.md); with more threads, to the tolerance the two-process tests below assert."""
    trainer, args = _cohort(backend)
    whole = trainer.train(*args())
    weights, loss = torch.full_like(whole.weights, float("nan")), torch.full_like(whole.loss, float("nan"))
    for r in range(world):  # what each rank computes on its own, before the all-gather
        parts, local = train_share(trainer, Ranks(r, world), TrainJob(*args()))
        assert local.weights.shape[0] == parts[r].numel()  # a rank trains its rows only
        weights[parts[r]], loss[parts[r]] = local.weights, local.loss
    assert sorted(torch.cat(parts).tolist()) == list(range(5))
    assert torch.equal(weights, whole.weights) and torch.equal(loss, whole.loss)
    assert torch.equal(whole.weights[1], args()[0])  # the inactive client stays at w_start


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_fisher_shares_equal_the_whole_cohort(backend):
    trainer, args = _cohort(backend)
    w0, x, y, index, n = args()[:5]
    weights = w0 + 0.1 * torch.randn(5, w0.numel(), dtype=torch.float64)
    fisher_args = (weights, x, y, index, n, 6)
    whole = fisher_diagonal(trainer, *fisher_args, round_generator(3, 1, "fisher"))
    out = torch.full_like(whole, float("nan"))
    for r in range(2):
        parts, local = fisher_share(trainer, Ranks(r, 2), FisherJob(*fisher_args, round_generator(3, 1, "fisher")))
        out[parts[r]] = local
    assert torch.equal(out, whole)


def test_one_process_calls_the_engine_exactly_as_before():
    calls = []

    class Engine:
        def train(self, *args, **kwargs):
            calls.append((args, kwargs))
            return "result"

    assert train_cohort(Engine(), Ranks(), TrainJob(*range(10))) == "result"
    assert calls == [(tuple(range(10)), {})]  # no rows, no copies, no collectives


def test_sum_over_ranks_with_one_process():
    like = torch.zeros(3, dtype=torch.float64)
    parts = [torch.tensor([1.5, 1.0, 2.0], dtype=torch.float64), torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64)]
    assert sum_over_ranks(parts, Ranks(), like).tolist() == [2.0, 1.0, 3.0]
    assert sum_over_ranks([], Ranks(), like) is None


def test_state_digest_sees_one_bit_and_check_digests_names_the_rank():
    net = nn.Linear(3, 2)
    before = state_digest(net)
    assert state_digest(net) == before
    with torch.no_grad():
        net.weight.view(-1)[4] = torch.nextafter(net.weight.view(-1)[4], torch.tensor(2.0))
    assert state_digest(net) != before
    check_digests([7, 7, 7], 3)
    with pytest.raises(RuntimeError, match=r"round 3: the state of ranks \[2\] differs from rank 0's"):
        check_digests([7, 7, 8], 3)


# ---------------------------------------------------------------------------- real DDP runs
CONFIG = """
seed_everything: 0
trainer:
  max_steps: 4
  val_check_interval: 2
  accelerator: cpu
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
model:
  net:
    class_path: lfed.models.zoo.MLP
    init_args: {in_features: 64, hidden: [32], num_classes: 10}
  fraction: 0.5
  training: {client_lr: 0.05, batch_size: 10, local_steps: 3}
data:
  dataset: digits
  num_clients: 8
  partition: dirichlet
  rho: 0.5
"""

CASES = {
    # stragglers make the work of the 4 clients uneven, so the split is not 2 + 2 by count
    "fedavg": ["--model.algorithm", "fedavg", "--model.stragglers.p_incomplete", "0.5"],
    # per-client control variates, AdaFL attention scores from the gathered weights, DWFed weights
    "scaffold": ["--model.algorithm", "scaffold", "--model.sampler", "attention", "--model.weighting", "dwfed"],
    # attention over every gathered update, client history; the loop backend
    "igfl": ["--model.algorithm", "igfl", "--model.engine.backend", "loop"],
    # Fisher reports split and gathered, compression residuals, T/s weights, an inactive client
    "efl": ["--model.algorithm", "efl", "--model.stragglers.p_inactive", "0.25",
            '--model.objective={"class_path": "lfed.client.objectives.EFL", "init_args": {"fisher_samples": 8}}'],
    # DP-FedAvg: Poisson cohorts split over the ranks, clipping on the gathered rows, the server noise from one
    # seeded stream (the same on every rank), adaptive clipping, the accountant in the checkpoint
    "dp": ["--model.algorithm", "dp_fedavg", "--model.combination", "lfed.privacy.DPFedAvg",
           "--model.combination.init_args.noise_multiplier", "1.0", "--model.combination.init_args.clip", "0.5",
           "--model.combination.init_args.target_quantile", "0.5", "--model.combination.init_args.count_noise", "1.0"],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fit_args(case_dir: Path, extra: list[str]) -> list[str]:
    """``fit`` on 2 processes (DDP, Gloo on the CPU) for one case, everything under ``case_dir``: checkpoints
    ``r2.ckpt`` and ``r4.ckpt`` after those rounds (before their evaluation) and ``end.ckpt`` after the last
    evaluation; ReplicaCheck compares the ranks after every round."""
    case_dir.mkdir(parents=True, exist_ok=True)
    config = case_dir / "ddp.yaml"
    config.write_text(CONFIG)
    callbacks = case_dir / "callbacks.yaml"
    callbacks.write_text(
        f"""
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {case_dir / 'ckpt'}, every_n_train_steps: 2, save_top_k: -1, filename: "r{{step}}", auto_insert_metric_name: false}}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {case_dir / 'ckpt'}, filename: end, save_on_train_epoch_end: true}}
    - class_path: lfed.lightning.ddp.ReplicaCheck
"""
    )
    return ["fit", "--config", str(config), "--config", str(callbacks), *extra, "--trainer.strategy", "ddp",
            "--trainer.devices", "2", "--trainer.default_root_dir", str(case_dir / "ddp")]


def _launch(cwd: Path, cmd: list[str], launcher: str) -> str:
    """Run ``cmd`` as 2 DDP processes and return the output of all of them.

    ``launcher="lightning"``: one command, Lightning starts the second process (one machine).
    ``launcher="torchrun"``: both processes started at once with the environment torchrun gives
    each worker (what ``torchrun`` and SLURM launches look like to Lightning).
    """
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    if launcher == "lightning":
        workers = [{}]
    else:
        port = str(_free_port())
        workers = [
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r),
             "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "NODE_RANK": "0", "TORCHELASTIC_RUN_ID": "lfed-test"}
            for r in range(2)
        ]
    procs = [subprocess.Popen(cmd, cwd=cwd, env={**env, **w}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for w in workers]
    try:
        outputs = [proc.communicate(timeout=900)[0] for proc in procs]
    finally:
        for proc in procs:  # a failed rank leaves the other waiting in a collective
            if proc.poll() is None:
                proc.kill()
    log = "\n".join(outputs)
    assert all(proc.returncode == 0 for proc in procs), log[-4000:]
    return log


def _two_processes(tmp_path: Path, extra: list[str], launcher: str) -> str:
    """``python -m lfed.lightning.cli fit ... --trainer.strategy ddp --trainer.devices 2`` for one case, its files
    under ``tmp_path`` (:func:`_fit_args`); returns the output of all processes."""
    return _launch(tmp_path, [sys.executable, "-m", "lfed.lightning.cli", *_fit_args(tmp_path, extra)], launcher)


def _two_processes_batch(root: Path, cases: dict[str, list[str]]) -> dict[str, str]:
    """Every case of ``cases`` on the same 2 processes, one after another (tests/lightning/ddp_batch.py: one launch,
    one process group, a fresh Trainer per case), each case's files under ``root/<case>`` as :func:`_two_processes`
    puts them. Returns each case's share of the output (rank 0's and rank 1's lines between the case's marks).

    One launch instead of one per case: a launch costs two interpreters importing Lightning (about 10 s each here);
    what each case checks is its own run's, which is the same whichever process ran a case before it."""
    import json

    plan = root / "cases.json"
    plan.write_text(json.dumps({name: _fit_args(root / name, extra) for name, extra in cases.items()}))
    log = _launch(root, [sys.executable, str(Path(__file__).parent / "ddp_batch.py"), str(plan)], "torchrun")
    assert "Starting with 2 processes" in log
    out = {}
    for name in cases:
        parts = log.split(f"=== lfed ddp case {name} ===")
        assert len(parts) == 3, f"case {name} did not run on both ranks:\n{log[-4000:]}"  # its mark once per rank
        out[name] = "\n".join(p.split("=== lfed ddp case ", 1)[0] if i else "" for i, p in enumerate(parts))
    return out


def _one_process(tmp_path: Path, extra: list[str], name: str, ckpt_path: Path | None = None):
    config = tmp_path / "one.yaml"
    config.write_text(CONFIG)
    args = ["fit", "--config", str(config), *extra, "--trainer.devices", "1", "--trainer.enable_checkpointing", "false",
            "--trainer.default_root_dir", str(tmp_path / name)]
    if ckpt_path is not None:
        args += ["--ckpt_path", str(ckpt_path)]
    return run_cli(args)


def _assert_same_state(a: dict, b: dict, what: str) -> float:
    """Every entry of two module states: float tensors to the contract's float32 tolerance (the runs here are
    float32; conftest.CROSS_MACHINE, docs/reproducibility.md), the rest exactly. Returns the largest |difference|."""
    assert a.keys() == b.keys(), what
    worst = 0.0
    for key in a:
        if not isinstance(a[key], torch.Tensor):
            assert a[key] == b[key], f"{what}, {key}"
            continue
        if a[key].is_floating_point():
            assert_within(a[key], b[key], torch.float32, f"{what}, {key}")
        else:
            assert torch.equal(a[key], b[key]), f"{what}, {key}"
        if a[key].is_floating_point() and a[key].numel():
            diff = float((a[key].double() - b[key].double()).abs().max())
            if diff:
                print(f"{what}, {key}: max |difference| {diff:g}")
            worst = max(worst, diff)
    return worst


#: The cases that share one launch of two torchrun-style processes (:func:`_two_processes_batch`); FedAvg and the grid
#: keep a launch of their own through Lightning's launcher (it starts the second process itself).
BATCH = {
    "scaffold": CASES["scaffold"],
    "igfl": CASES["igfl"],
    "efl": CASES["efl"],
    "dp": CASES["dp"],
    "secure": CASES["dp"] + ["--model.combination.init_args.noise", "secure"],
    "scaffold-host": CASES["scaffold"] + ["--model.engine.client_state", "host"],
    "efl-disk": CASES["efl"] + ["--model.engine.client_state", "disk"],
    # SCAFFOLD's round-2 checkpoint resumed on the same 2 processes ({root}: the batch's folder; after "scaffold")
    "scaffold-resumed": CASES["scaffold"] + ["--ckpt_path", "{root}/scaffold/ckpt/r2.ckpt"],
}


def batch_of(tmp_path_factory, cases: dict[str, list[str]]) -> tuple[Path, dict[str, str]]:
    """Every case of ``cases`` on the same 2 processes, one launch (:func:`_two_processes_batch`): their root folder
    and each case's output (a module fixture of each test file that has DDP cases)."""
    root = tmp_path_factory.mktemp("ddp_batch")
    cases = {name: [a.replace("{root}", str(root)) for a in args] for name, args in cases.items()}
    return root, _two_processes_batch(root, cases)


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Every case of :data:`BATCH` on 2 processes: their root folder and each case's output."""
    return batch_of(tmp_path_factory, BATCH)


def _check_two_against_one(case: str, case_dir: Path, log: str, tmp_path: Path) -> None:
    """The 2-process run of ``case`` (files under ``case_dir``, output ``log``) against the same run on 1 process, and
    its round-2 checkpoint resumed on 1 process."""
    extra = CASES[case]
    assert "ReplicaCheck: the state of all 2 ranks was identical at each of 4 checks" in log

    ddp = torch.load(case_dir / "ckpt" / "end.ckpt", map_location="cpu", weights_only=False)
    mid = case_dir / "ckpt" / "r2.ckpt"
    assert ddp["global_step"] == 4  # a round is a step on every rank

    one = _one_process(tmp_path, extra, "one")
    one_state = {k: v.cpu() if torch.is_tensor(v) else v for k, v in one.model.state_dict().items()}
    worst = _assert_same_state(ddp["state_dict"], one_state, f"{case}: 2 processes vs 1")
    assert [r for r, _ in ddp["lfed"]["runs"][0]["eval_history"]] == [2, 4]
    assert ddp["lfed"]["runs"][0]["eval_history"] == one.model.eval_history  # test accuracy: exact counts
    assert ddp["lfed"]["runs"][0]["comm"] == one.model.comm.state_dict()
    for saved, live in zip(ddp["optimizer_states"][0]["runs"], [o.state_dict() for o in one.model.server_optimizers]):
        for key, state in saved["state"].items():
            _assert_same_state(state, live["state"][key], f"{case}: server optimizer state")

    resumed = _one_process(tmp_path, extra, "resumed", ckpt_path=mid)
    assert resumed.trainer.global_step == 4
    resumed_state = {k: v.cpu() if torch.is_tensor(v) else v for k, v in resumed.model.state_dict().items()}
    worst = max(worst, _assert_same_state(resumed_state, ddp["state_dict"], f"{case}: resumed on 1 vs 2 processes"))
    _assert_same_state(resumed_state, one_state, f"{case}: resumed on 1 vs 1 process")
    print(f"{case}: max |difference| over the module state = {worst:g}")


def test_two_processes_started_by_lightning_give_the_one_process_run_and_resume_on_one(tmp_path):
    """FedAvg with stragglers through Lightning's own launcher (one command; Lightning starts the second process)."""
    log = _two_processes(tmp_path / "ddp_run", CASES["fedavg"], "lightning")
    assert "Starting with 2 processes" in log
    _check_two_against_one("fedavg", tmp_path / "ddp_run", log, tmp_path)


@pytest.mark.parametrize("case", ["scaffold", "igfl", "efl", "dp"])
def test_two_processes_give_the_one_process_run_and_resume_on_one(case, batch, tmp_path):
    root, logs = batch
    _check_two_against_one(case, root / case, logs[case], tmp_path)


def test_two_processes_stopped_and_resumed_on_two_end_bit_for_bit_as_the_uninterrupted_run(batch):
    """docs/reproducibility.md: a DDP run resumed on the same number of processes (and threads, machine, software)
    continues bit for bit: SCAFFOLD with AdaFL sampling and DWFed weights, its round-2 checkpoint resumed to round 4."""
    root, logs = batch
    assert "ReplicaCheck: the state of all 2 ranks was identical" in logs["scaffold-resumed"]
    whole = torch.load(root / "scaffold" / "ckpt" / "end.ckpt", map_location="cpu", weights_only=True)
    resumed = torch.load(root / "scaffold-resumed" / "ckpt" / "end.ckpt", map_location="cpu", weights_only=True)
    assert whole["global_step"] == resumed["global_step"] == 4
    assert whole["state_dict"].keys() == resumed["state_dict"].keys()
    for key, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value) if isinstance(value, torch.Tensor) else \
            resumed["state_dict"][key] == value, key
    # the uploads counted; not the evaluations' history: r2.ckpt was written before round 2's evaluation (_fit_args)
    comm = [{k: v for k, v in c["lfed"]["runs"][0]["comm"].items() if k != "history"} for c in (resumed, whole)]
    assert comm[0] == comm[1]


def test_secure_noise_on_two_processes_is_the_same_on_every_rank(batch):
    """noise: secure draws from the OS on rank 0 and sends the seed to every rank: ReplicaCheck finds the two ranks'
    state identical after every round (each rank drawing its own would split the model and the Poisson cohort)."""
    log = batch[1]["secure"]
    assert "ReplicaCheck: the state of all 2 ranks was identical at each of 4 checks" in log
    assert "DP noise and Poisson cohorts: secure" in log


@pytest.mark.parametrize("case, placement", [("scaffold", "host"), ("efl", "disk")])
def test_two_processes_with_rows_off_the_device_give_the_one_process_device_run(case, placement, batch, tmp_path):
    """Each rank keeps a full replica of the client state (lfed.state.stores) in its placement:
    2 processes with ``host`` / ``disk`` rows end in the state of 1 process with dense ``device``
    buffers (the same sparse checkpoint entries), and the ranks agree after every round."""
    extra = CASES[case]
    root, logs = batch
    case_dir = root / f"{case}-{placement}"
    assert "ReplicaCheck: the state of all 2 ranks was identical at each of 4 checks" in logs[f"{case}-{placement}"]
    ddp = torch.load(case_dir / "ckpt" / "end.ckpt", map_location="cpu", weights_only=True)
    assert any(k.endswith(".rows") for k in ddp["state_dict"])
    one = _one_process(tmp_path, extra, "one")
    assert one.model.store.placement == "device"
    _assert_same_state(ddp["state_dict"], {k: v.cpu() if torch.is_tensor(v) else v for k, v in one.model.state_dict().items()},
                       f"{case}: 2 processes ({placement}) vs 1 (device)")
    if placement == "disk":  # each rank made its files under <default_root_dir>/client_state; they went with it
        dirs = [d for d in case_dir.rglob("client_state") if d.is_dir()]
        assert dirs and not [f for d in dirs for f in d.rglob("*.rows")], dirs


def test_two_processes_say_each_line_once_and_no_sync_dist_advice(tmp_path):
    """Issue 66 item 9: a 2-process ``lfed fit`` (Lightning's launcher, the quickstart, lfed's metrics CSV) prints its
    start line, its table and its summary once (rank 0's), and none of Lightning's 7 warnings that an evaluation metric
    is logged without ``sync_dist=True``: the ranks log the same numbers, reduced before they are logged
    (:func:`lfed.lightning.ddp.logged_as_reduced`), so they are not averaged again."""
    from conftest import REPO

    log = _launch(tmp_path, [sys.executable, "-m", "lfed.lightning.cli", "fit", "--config", str(REPO / "configs/quickstart.yaml"),
                             "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.accelerator", "cpu",
                             "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.enable_progress_bar", "false"],
                  "lightning")
    assert "Starting with 2 processes" in log
    ours = [line for line in log.splitlines() if line.startswith("lfed: ")]
    for start in ("lfed: fedavg on 20 clients", "lfed: evaluations of the global model", "lfed: final/test_acc"):
        assert sum(line.startswith(start) for line in ours) == 1, log
    assert len(ours) == len(set(ours)), ours
    assert "sync_dist" not in log, log
    [run] = tmp_path.glob("runs/*/version_0")  # and the ranks wrote one run's folder
    assert (run / "metrics.csv").is_file() and (run / "config.yaml").is_file()


def test_a_grid_on_two_processes_equals_the_grid_on_one(tmp_path):
    """``lfed grid --trainer.strategy ddp --trainer.devices 2``: the union of the runs' cohorts (FedAvg and
    SCAFFOLD, two learning rates: two engine calls a round) split over the ranks, the ranks identical after
    every round (ReplicaCheck), and every run's state, evaluations and counters those of the grid on one process."""
    from lfed.lightning.grid import run_grid

    repo = Path(__file__).resolve().parents[2]
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: g\nmethod: grid\nparameters:\n  model.algorithm:\n    values: [fedavg, scaffold]\n"
                     "  model.training.client_lr:\n    values: [0.05, 0.1]\n")
    common = ["--config", str(repo / "configs" / "quickstart.yaml"), "--sweep", str(sweep), "--trainer.max_steps=4",
              "--trainer.val_check_interval=2", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
              "--checkpoint_every=2"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "lfed", "grid", *common, "--root", str(tmp_path / "ddp"), "--trainer.strategy=ddp",
           "--trainer.devices=2", "--trainer.callbacks+=lfed.lightning.ddp.ReplicaCheck"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "ReplicaCheck: the state of all 2 ranks was identical at each of 4 checks" in proc.stdout
    one, _ = run_grid([*common, "--root", str(tmp_path / "one"), "--trainer.devices=1"])
    [ddp_ckpt] = (tmp_path / "ddp").glob("grids/*/checkpoints/last.ckpt")
    [one_ckpt] = (tmp_path / "one").glob("grids/*/checkpoints/last.ckpt")
    ddp, single = (torch.load(p, map_location="cpu", weights_only=False) for p in (ddp_ckpt, one_ckpt))
    assert ddp["global_step"] == single["global_step"] == 4
    assert sum(k.endswith("net.net.0.weight") for k in ddp["state_dict"]) == 4  # four runs in one checkpoint
    worst = _assert_same_state(ddp["state_dict"], single["state_dict"], "grid: 2 processes vs 1")
    for a, b in zip(ddp["lfed"]["runs"], single["lfed"]["runs"]):
        assert a["name"] == b["name"]
        assert a["eval_history"] == b["eval_history"] and [r for r, _ in a["eval_history"]] == [2, 4]
        assert a["comm"] == b["comm"]
    print(f"grid: max |difference| over the runs' state = {worst:g}")
