"""lfed.lightning.callbacks: attention heatmaps (000 Fig. 2) and the communication table, on real runs."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from conftest import run_rounds
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger
from PIL import Image
from torch import nn

from lfed.lightning.callbacks import AttentionHeatmap, CommunicationCost, render_attention
from lfed.lightning.datamodule import FederatedDataModule
from lfed.lightning.module import FederatedModule
from lfed.server.attention import attention_combine
from lfed.server.combination import IGFLAttention


def _digits(num_clients=6):
    return FederatedDataModule(dataset="digits", num_clients=num_clients, partition="shards", shards_per_client=2,
                               holdout_fraction=0.0)


def _module(**kwargs):
    torch.manual_seed(0)
    kwargs.setdefault("fraction", 0.5)
    return FederatedModule(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), training=dict(client_lr=0.05, batch_size=20, local_steps=2),
                           **kwargs)


def _attention(query):
    """The attention combination with ``query``, at the temperature every attention run here uses."""
    return IGFLAttention(query, temperature=10.0)


def test_heatmaps_are_real_pngs_under_the_log_dir(tmp_path):
    cb = AttentionHeatmap(every_n_rounds=2)
    m = _module(algorithm="igfl_s", combination=_attention("self"))
    run_rounds(m, _digits(), rounds=3, precision="32-true", callbacks=[cb], default_root_dir=tmp_path)
    names = sorted(p.name for p in (tmp_path / "attention").iterdir())
    # round 2 by the schedule, round 3 at the end of training; last and mean each
    assert names == [f"attention_{kind}_round{r:05d}.png" for kind in ("last", "mean") for r in (2, 3)]
    for path in (tmp_path / "attention").iterdir():
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] >= 300 and im.size[1] >= 200
            pixels = np.asarray(im.convert("RGB"), dtype=np.float64)
        assert pixels.std() > 10  # a drawing, not a blank canvas
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "attention" / "attention_last_round00003.png").ndim == 3
    assert cb.rounds_seen == 3 and cb.query == "self"


def test_mean_heatmap_averages_each_client_pair_over_the_rounds_they_met():
    """Round 0 cohort (2, 0), round 1 cohort (0, 1): α_00 = mean of both rounds, α_21 never seen (NaN)."""
    cb = AttentionHeatmap(every_n_rounds=100)
    r0 = attention_combine(torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64), "self")
    r1 = attention_combine(torch.tensor([[1.0, 1.0], [0.5, 0.0]], dtype=torch.float64), "self")
    cb.add(r0, torch.tensor([2, 0]), num_clients=3)
    cb.add(r1, torch.tensor([0, 1]), num_clients=3)
    mean, rows, cols = cb.mean_matrix()
    assert rows == cols == [0, 1, 2]
    a0, a1 = r0.matrix.numpy(), r1.matrix.numpy()
    # client 0 is row 1 of round 0 and row 0 of round 1
    assert mean[0, 0] == pytest.approx((a0[1, 1] + a1[0, 0]) / 2, abs=1e-15)
    assert mean[0, 2] == pytest.approx(a0[1, 0], abs=1e-15)  # (0, 2) met only in round 0
    assert mean[1, 0] == pytest.approx(a1[1, 0], abs=1e-15)  # (1, 0) met only in round 1
    assert np.isnan(mean[2, 1]) and np.isnan(mean[1, 2])
    # by hand for round 0: row of client 0 (Δ = [0, 2]): ψ = (0, 4) -> α = (1, e^4) / (1 + e^4)
    assert a0[1, 1] == pytest.approx(np.exp(4) / (1 + np.exp(4)), abs=1e-15)


def test_heatmap_goes_to_wandb_log_image_when_that_logger_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")  # no account, no network
    logged = []
    monkeypatch.setattr(WandbLogger, "log_image",
                        lambda self, key, images, step=None, **kw: logged.append((key, images, step)))
    logger = WandbLogger(save_dir=str(tmp_path), project="lfed-test")
    cb = AttentionHeatmap(every_n_rounds=3)
    m = _module(algorithm="igfl_s", combination=_attention("global"))
    Trainer(max_steps=3, accelerator="cpu", logger=logger, callbacks=[cb], default_root_dir=tmp_path,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            limit_val_batches=0, num_sanity_val_steps=0).fit(m, datamodule=_digits())
    assert [(k, s) for k, _, s in logged] == [("attention/last", 3), ("attention/mean", 3)]
    for _, images, _ in logged:
        assert len(images) == 1 and images[0].ndim == 3 and images[0].shape[2] == 3
        assert images[0].shape[0] >= 150 and images[0].std() > 10
    assert not (tmp_path / "attention").exists() and cb.written == []  # W&B only, unless dirpath is set


def test_time_attention_heatmap_and_an_explicit_folder(tmp_path):
    cb = AttentionHeatmap(every_n_rounds=2, average=False, dirpath=str(tmp_path / "maps"))
    m = _module(algorithm="igfl_s_time", combination=_attention("time"), fraction=1.0)
    run_rounds(m, _digits(num_clients=4), rounds=2, precision="32-true", callbacks=[cb], default_root_dir=tmp_path)
    assert [p.name for p in cb.written] == ["attention_last_round00002.png"]
    with Image.open(cb.written[0]) as im:
        assert im.size[0] >= 300


def test_no_attention_no_heatmaps_one_warning(tmp_path):
    cb = AttentionHeatmap(every_n_rounds=1)
    with pytest.warns(UserWarning, match="AttentionHeatmap: the module's aggregation is 'mean'"):
        run_rounds(_module(), _digits(), rounds=2, precision="32-true", callbacks=[cb], default_root_dir=tmp_path)
    assert cb.written == [] and not (tmp_path / "attention").exists()


def test_render_attention_checks_labels_and_blanks_nan():
    with pytest.raises(ValueError, match="matrix: shape"):
        render_attention(np.zeros((2, 3)), ["a", "b"], ["a", "b"], "t")
    fig = render_attention(np.array([[0.5, np.nan], [0.2, 0.8]]), ["0", "1"], ["0", "1"], "t")
    fig.canvas.draw()
    assert np.asarray(fig.canvas.buffer_rgba()).shape[2] == 4


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_bad_every_n_rounds(every):
    with pytest.raises(ValueError, match="every_n_rounds"):
        AttentionHeatmap(every_n_rounds=every)
    with pytest.raises(ValueError, match="every_n_rounds"):
        CommunicationCost(every_n_rounds=every)


def test_communication_table_matches_the_meter(tmp_path):
    cb = CommunicationCost()
    m = _module(channel=0.1)
    run_rounds(m, _digits(), rounds=4, precision="32-true", callbacks=[cb], default_root_dir=tmp_path)
    with open(tmp_path / "communication.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(float(r["round"])) for r in rows] == [1, 2, 3, 4]
    assert all(int(float(r["uploads"])) == 3 for r in rows)  # 6 clients, fraction 0.5
    last = rows[-1]
    assert float(last["bits_up_total"]) == m.comm.bits_up and float(last["uploads_total"]) == 12
    assert float(last["megabytes_total"]) == pytest.approx((m.comm.bits_up + m.comm.bits_down) / 8e6)
    assert sum(float(r["bits_down"]) for r in rows) == m.comm.bits_down


# ----------------------------------------------------------------------------- issue 14, item 15


def test_heatmap_colour_scale_spans_the_data_range_not_zero():
    """A mean global-attention strip of close weights: the colours must tell them apart."""
    strip = np.array([[0.19, 0.2, 0.21, 0.205]])
    fig = render_attention(strip, ["mean Δ"], ["0", "1", "2", "3"], "global")
    norm = fig.axes[0].images[0].norm
    assert (norm.vmin, norm.vmax) == (pytest.approx(0.19), pytest.approx(0.21))
    colours = fig.axes[0].images[0].to_rgba(strip)[0]
    assert np.abs(colours[0] - colours[2]).max() > 0.3  # lowest and highest cells look different
    assert not [t for t in fig.texts if "blank" in t.get_text()]  # no blank cell, no caption


def test_heatmap_explains_blank_cells_of_never_paired_clients():
    matrix = np.array([[0.5, np.nan], [0.3, 0.7]])
    fig = render_attention(matrix, ["0", "1"], ["0", "1"], "self")
    assert [t.get_text() for t in fig.texts] == ["blank: clients never in a cohort together"]


def test_heatmap_titles_count_rounds_as_the_file_names_do(tmp_path, monkeypatch):
    import lfed.lightning.callbacks as callbacks

    titles = []
    real = callbacks.render_attention

    def spy(matrix, rows, cols, title, **kwargs):
        titles.append(title)
        return real(matrix, rows, cols, title, **kwargs)

    monkeypatch.setattr(callbacks, "render_attention", spy)
    cb = AttentionHeatmap(every_n_rounds=2)
    run_rounds(_module(algorithm="igfl_s", combination=_attention("self")), _digits(), rounds=3, precision="32-true", callbacks=[cb],
               default_root_dir=tmp_path)
    assert [p.name for p in cb.written] == [f"attention_{k}_round{r:05d}.png" for r in (2, 3) for k in ("last", "mean")]
    assert [t.split(" (entropy")[0] for t in titles] == [
        "self-attention, round 2", "self-attention, mean over 2 rounds (to round 2)",
        "self-attention, round 3", "self-attention, mean over 3 rounds (to round 3)",
    ]
