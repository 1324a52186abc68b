"""Issue 49: the privacy claim holds round by round. Adaptive clipping clips, counts, noises and logs at the same
C_t; the noise of one round (not an average over rounds) has the stated scale; a component's state read before it
is written keeps its value; the noise is seeded (reproducible, keyed by the run's settings) or secure (nothing
logged regenerates it); splits of the clients' own data are not server-held; a DP checkpoint marks its client data."""

from __future__ import annotations

import math

import pytest
import torch

from lfed.base.component import Cohort, Component, standalone_store
from lfed.core.algorithm import LocalTraining
from lfed.core.fit import fit_run
from lfed.core.settings import build_run
from lfed.data.datasets import load_dataset
from lfed.data.tensors import DatasetTensors
from lfed.lightning.datamodule import FederatedDataModule
from lfed.models.zoo import MLP
from lfed.privacy import DPFedAvg
from lfed.privacy.contents import classify, flatten
from lfed.rng import PrivateStreams, round_generator
from lfed.state.spec import StateSpec

N = 10


def _dp(P: int, **kwargs) -> DPFedAvg:
    dp = DPFedAvg(**kwargs)
    dp.delta = 1e-5
    dp.setup_state(standalone_store(), torch.ones(N), P, torch.zeros(1, dtype=torch.float64))
    dp.update_multiplier = dp._update_multiplier()
    return dp


def _cohort(r: int, K: int, m: float) -> Cohort:
    c = Cohort(r, torch.arange(K), torch.ones(K), torch.ones(K), torch.ones(K), N, expected_size=m, seed=7)
    c.counting = torch.ones(K, dtype=torch.bool)
    return c


# ---------------------------------------------------------------------------------------------- one round's noise
ADAPTIVE = dict(noise_multiplier=1.3, clip=0.5, target_quantile=0.5, clip_lr=1.0, count_noise=1.0)


def test_each_rounds_noise_has_the_scale_of_the_bound_it_clipped_with():
    """Zero updates, 8 clients, m = 4: every client is under the bound, b̃ ≈ 2, so C_{t+1} = C_t exp(-(b̃ - 0.5)) is
    0.08-0.6 C_t (clip_lr 1). In each of two rounds, on its own, the noise Δ·m/C_t has standard deviation z_Δ within
    3% (P = 40,000: the estimate's error is 0.35%), where z_Δ = (z⁻² - (2σ_b)⁻²)^(-1/2); noised at C_{t+1} it would be
    0.08-0.6 of it. privacy/clip is C_t and differs from privacy/clip_next. Fails on 0.4 (noise at C_{t+1})."""
    P, m = 40000, 4.0
    dp = _dp(P, **ADAPTIVE)
    z_delta = (1.3 ** -2 - 2.0 ** -2) ** -0.5
    for r in range(2):
        C_t = float(dp.state("clip"))
        delta, _ = dp.combine(torch.zeros(8, P, dtype=torch.float64), None, _cohort(r, 8, m))
        report = dp.report(None)
        C_next = float(dp.state("clip"))
        assert C_next / C_t < 0.7  # the bound moved a lot in this round
        assert float(report["privacy/clip"]) == C_t
        assert float(report["privacy/clip_next"]) == C_next != C_t
        assert abs(float((delta * m / C_t).std()) / z_delta - 1) < 0.03


def test_one_adaptive_round_by_hand_with_its_count_noise_read_back():
    """Seeded noise, read back from its stream (seed 7, round r, "dp-noise": the count's draw first, then the
    update noise): rows of norms 0.3, 0.45, 0.8, 2.0 against C_t = 0.5 (then C_1): b̃ = (#{‖Δ_k‖ ≤ C_t} + σ_b·draw) / m,
    C_{t+1} = C_t exp(-η_C (b̃ - γ)), Δ = (Σ_k Δ_k min(1, C_t/‖Δ_k‖) + z_Δ C_t ξ) / m, each to 1e-15, in two rounds."""
    P, m = 3, 4.0
    dp = _dp(P, **ADAPTIVE)
    z_delta = dp.update_multiplier
    norms = torch.tensor([0.3, 0.45, 0.8, 2.0], dtype=torch.float64)
    direction = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64) / 3
    updates = norms[:, None] * direction
    C = 0.5
    for r in range(2):
        delta, _ = dp.combine(updates, None, _cohort(r, 4, m))
        g = round_generator(7, r, "dp-noise")
        draw = float(torch.randn((), generator=g, dtype=torch.float64))
        xi = torch.randn(P, generator=g, dtype=torch.float64)
        below = float((norms <= C).sum())
        b = (below + 1.0 * draw) / m
        clipped = sum(u * min(1.0, C / float(n)) for u, n in zip(updates, norms))
        want = (clipped + z_delta * C * xi) / m
        torch.testing.assert_close(delta, want, atol=1e-15, rtol=0)
        assert float(dp.report(None)["privacy/clip"]) == pytest.approx(C, rel=1e-15)
        C = C * math.exp(-1.0 * (b - 0.5))
        assert float(dp.state("clip")) == pytest.approx(C, rel=1e-14)
        assert float(dp.report(None)["privacy/clipped_fraction"]) == pytest.approx(1 - b, rel=1e-14)


def test_a_state_read_before_it_is_written_keeps_its_value():
    """The store replaces server state (a new tensor), never writes it in place: what a component read in a step is
    the value it read, whatever it stores after (the bug class of issue 49), on every store."""

    class ReadWrite(Component):
        name = "rw"

        def state_specs(self):
            return [StateSpec("s", shape=(3,), per_client=False, init=1.0, dtype=torch.float64)]

    c = ReadWrite()
    c.setup_state(standalone_store(), torch.ones(N), 3, torch.zeros(1, dtype=torch.float64))
    before = c.state("s")
    c.set_state("s", before * 5)
    assert before.tolist() == [1.0, 1.0, 1.0]
    assert c.state("s").tolist() == [5.0, 5.0, 5.0]
    assert c.state_dict()["s"].tolist() == [5.0, 5.0, 5.0]  # the checkpoint sees the new value


# ---------------------------------------------------------------------------------------------- noise modes
def test_secure_noise_is_fresh_has_the_stated_scale_and_no_logged_seed_regenerates_it():
    """noise: secure: two runs of one seed and round draw different noise; none of the seeded streams of the seed
    (keyed or not) gives it back; its standard deviation is still zC/m (the sum of 4 draws / 2)."""
    P, m, z, C = 40000, 4.0, 1.3, 0.5
    a = _dp(P, noise_multiplier=z, clip=C, noise="secure")
    b = _dp(P, noise_multiplier=z, clip=C, noise="secure")
    zeros = torch.zeros(3, P, dtype=torch.float64)
    da, db = a.combine(zeros, None, _cohort(0, 3, m))[0], b.combine(zeros, None, _cohort(0, 3, m))[0]
    assert not torch.equal(da, db)
    assert abs(float(torch.corrcoef(torch.stack([da, db]))[0, 1])) < 0.05
    for d in (da, db):
        assert abs(float((d * m / C).std()) / z - 1) < 0.03
    seeded = _dp(P, noise_multiplier=z, clip=C).combine(zeros, None, _cohort(0, 3, m))[0]
    assert abs(float(torch.corrcoef(torch.stack([da, seeded]))[0, 1])) < 0.05
    # the seeded stream is the seed's: anyone with the seed regenerates it exactly
    regenerated = (z * C / m) * torch.randn(P, generator=round_generator(7, 0, "dp-noise"), dtype=torch.float64)
    torch.testing.assert_close(seeded, regenerated, atol=1e-15, rtol=0)


def test_bad_noise_settings_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="noise: 'urandom' is not one of"):
        DPFedAvg(noise="urandom")
    with pytest.raises(ValueError, match="common_noise: shared noise streams need noise: seeded"):
        DPFedAvg(noise="secure", common_noise=True)


def _digits():
    ds = load_dataset("digits")
    return FederatedDataModule.from_tensors(ds.train_x, ds.train_y, ds.test_x, ds.test_y, num_clients=N,
                                            partition="dirichlet", rho=0.5, seed=0)


def _changes(client_lr: float, seed: int = 0, rounds: int = 2, **dp) -> torch.Tensor:
    """Each round's change of the global model of a DP run whose clients barely move (client_lr ~1e-12): its noise."""
    torch.manual_seed(0)
    run = build_run(net=MLP(64, [16], 10), algorithm="dp_fedavg", fraction=1.0, seed=seed,
                    combination=DPFedAvg(noise_multiplier=1.0, clip=0.5, **dp),
                    training=LocalTraining(client_lr=client_lr, batch_size=10, local_steps=1))
    data, out = _digits(), []
    for _ in range(rounds):
        before = run.layout.module_vector(run.net).clone()
        fit_run(run, data, 1)
        out.append(run.layout.module_vector(run.net) - before)
    return torch.stack(out)


def test_runs_of_other_settings_at_one_seed_never_share_noise_unless_asked():
    """Two runs at seed 0 that differ only in client_lr (1e-12 and 2e-12: their clients' updates are ~1e-12, so each
    round's change is its noise, std zC/N = 0.05): uncorrelated (P = 1,210: |ρ| < 0.2 is 7 standard deviations; a
    shared stream gives ρ = 1). With common_noise they draw the same noise. The same settings twice: the same run."""
    a, b = _changes(1e-12), _changes(2e-12)
    for r in range(2):
        assert abs(float(torch.corrcoef(torch.stack([a[r], b[r]]))[0, 1])) < 0.2
    ca, cb = _changes(1e-12, common_noise=True), _changes(2e-12, common_noise=True)
    assert float(torch.corrcoef(torch.stack([ca[0], cb[0]]))[0, 1]) > 0.999
    torch.testing.assert_close(_changes(1e-12), a, atol=0, rtol=0)


def test_secure_runs_of_one_seed_differ_and_seeded_ones_repeat(capsys):
    """End to end: two secure runs of one seed and settings draw other noise (and say so at start-up); two seeded
    runs are equal bit for bit (and say the guarantee assumes the seed is unknown)."""
    s1, s2 = _changes(1e-12, noise="secure", rounds=1), _changes(1e-12, noise="secure", rounds=1)
    assert abs(float(torch.corrcoef(torch.cat([s1, s2]))[0, 1])) < 0.2
    assert "DP noise and Poisson cohorts: secure" in capsys.readouterr().err
    _changes(1e-12, rounds=1)
    assert "does not know the seed" in capsys.readouterr().err


def test_a_secure_poisson_cohort_is_not_the_seeds():
    """The Poisson cohort is part of the mechanism: under noise: secure it is drawn from the OS, so 20 rounds of
    one seed are not the seeded sampler's cohorts (q = 0.5 of 10: equal by chance with probability 2^-10 a round)."""
    from lfed.participation.sampling import PoissonSampler

    sampler = PoissonSampler()
    sampler.num_clients = N
    secure = PrivateStreams("secure")
    same = 0
    for r in range(20):
        seeded_ids, _ = sampler.sample(r, 5, round_generator(0, r, "sample"))
        secure_ids, _ = sampler.sample(r, 5, secure.generator(0, r, "sample"))
        same += int(torch.equal(seeded_ids, secure_ids))
    assert same <= 2


# ---------------------------------------------------------------------------------------------- server-held data
class _LeafLike(FederatedDataModule):
    """Digits with every test example labelled by the writer (client) it came from, as LEAF's are."""

    def _load(self):
        ds = load_dataset("digits")
        groups = torch.arange(ds.train_y.numel()) % N
        return DatasetTensors("custom", ds.train_x, ds.train_y, ds.test_x, ds.test_y, 10,
                              train_groups=groups, test_groups=torch.arange(ds.test_y.numel()) % N)


def test_a_test_split_of_the_clients_own_data_is_client_data_under_dp(capsys):
    """LEAF-like data (test examples of the training writers): the data says so (notes); a DP run logs no test/*
    metric by default and says why at start-up; with log_unaccounted they are logged as unaccounted/test/*; a run
    on a pooled dataset (digits) keeps test/* server-held."""
    leafy = _LeafLike(dataset="digits", num_clients=N, partition="natural", seed=0)
    assert leafy.build().notes == frozenset({"test_from_clients"})
    assert _digits().build().notes == frozenset()

    def history(data, **dp):
        torch.manual_seed(0)
        run = build_run(net=MLP(64, [16], 10), algorithm="dp_fedavg", fraction=1.0,
                        combination=DPFedAvg(noise_multiplier=1.0, clip=0.5, **dp),
                        training=LocalTraining(client_lr=0.1, batch_size=10, local_steps=1))
        return fit_run(run, data, 2, evaluate_every=1)

    dropped = history(leafy)
    assert not any(k.startswith(("test/", "final/test")) for h in dropped for k in h)
    assert "belongs to the training clients" in capsys.readouterr().err
    marked = history(_LeafLike(dataset="digits", num_clients=N, partition="natural", seed=0), log_unaccounted=True)
    assert "unaccounted/test/acc" in marked[-1]
    assert "test/acc" in history(_digits())[-1]


# ---------------------------------------------------------------------------------------------- the checkpoint
def test_every_key_of_a_dp_checkpoint_is_in_the_release_table_and_client_data_is_marked(tmp_path, capsys):
    """A DP-SCAFFOLD run's checkpoint (per-client c_k, the accountant, the comm counts, BMTA): every flattened key
    has a row of lfed.privacy.contents.CONTENTS; lfed.client_data lists exactly the client-class keys (c_k among
    them); the run's end names the folder."""
    from lightning.pytorch import Trainer

    from lfed.client.objectives import Scaffold
    from lfed.lightning.module import FederatedModule

    torch.manual_seed(0)
    module = FederatedModule(MLP(64, [16], 10), algorithm="dp_fedavg", fraction=0.5, seed=0,
                             objective=Scaffold(control_clip=1.0, control_noise=4.0),
                             combination=DPFedAvg(noise_multiplier=1.0, clip=0.5),
                             training=LocalTraining(client_lr=0.05, batch_size=10, local_steps=2))
    trainer = Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=tmp_path, check_val_every_n_epoch=None, val_check_interval=2)
    trainer.fit(module, datamodule=_digits())
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    ck = torch.load(path, weights_only=False)
    per_client = ["objective.client_control"]
    unknown = [k for k in flatten(ck) if classify(k, per_client)[0] == "unknown"]
    assert unknown == []
    marked = ck["lfed"]["client_data"]
    assert set(marked) == {k for k in flatten(ck) if classify(k, per_client)[0] == "client" and not k.startswith("lfed.client_data")}
    assert any(".objective.client_control" in k for k in marked)  # its rows (dense, or sparse: clients and rows)
    assert any(k.endswith("bmta.last_cohort") for k in marked) and any(".comm." in k for k in marked)
    assert not any(k.endswith("objective.control") or ".net." in k for k in marked)  # noised releases


def test_a_run_without_dp_marks_nothing(tmp_path):
    from lightning.pytorch import Trainer

    from lfed.lightning.module import FederatedModule

    torch.manual_seed(0)
    module = FederatedModule(MLP(64, [16], 10), fraction=0.5, seed=0, training=LocalTraining(client_lr=0.05, local_steps=1))
    trainer = Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, default_root_dir=tmp_path, check_val_every_n_epoch=None, val_check_interval=1)
    trainer.fit(module, datamodule=_digits())
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    assert "client_data" not in torch.load(tmp_path / "x.ckpt", weights_only=False)["lfed"]

