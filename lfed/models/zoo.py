"""The papers' models as plain ``nn.Module`` classes.

Every constructor takes simple typed arguments with defaults, so a model can be
configured from YAML through LightningCLI's ``class_path``/``init_args``. The
parameter count of each model (``sum(p.numel() for p in model.parameters())``)
is worked out in its docstring and held exactly by ``tests/models/test_zoo.py``.

Inputs are ``[B, *sample_shape]``: the image models reshape each sample to the
image shape they need (so ``[B, 784]``, ``[B, 28, 28]`` and ``[B, 1, 28, 28]``
all work for MNIST), the dense models flatten it. No model hard-codes a device
or dtype; ``model.double()`` gives a float64 model.

``torch.func`` compatibility (the engine's ``vmap`` backend runs
``functional_call`` under ``vmap`` over stacked client parameters):

* every model here except :class:`CharLSTM` with ``unrolled=False`` vmaps;
* models with dropout (:class:`ReddiEMNISTCNN` with ``dropout=True``) need
  ``vmap(..., randomness="different")`` in training mode (each client draws its
  own masks); with the default ``randomness="error"`` torch raises;
* ``nn.LSTM`` has no batching rule (``aten::lstm``), so :class:`CharLSTM` with
  the default ``unrolled=False`` raises under ``vmap``; use the loop backend, or
  ``unrolled=True``, which computes the same LSTM from the same parameters with
  explicit matrix products and vmaps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lfed.checks import integer

__all__ = [
    "LogisticRegression",
    "MLP",
    "McMahanMNISTCNN",
    "McMahanCIFARCNN",
    "ReddiEMNISTCNN",
    "CharLSTM",
    "CharTransformer",
    "SmallCNN",
    "MODELS",
    "build_model",
    "count_parameters",
]


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters, ``P`` in lfed's flat-parameter convention.

    Args:
        model: Any module.

    Returns:
        ``sum(p.numel() for p in model.parameters() if p.requires_grad)``.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _check_positive_int(name: str, value: Any) -> None:
    integer(name, value, at_least=1)


def _as_images(x: Tensor, channels: int, height: int, width: int) -> Tensor:
    """Reshape ``[B, *sample_shape]`` to ``[B, C, H, W]`` (sample numel must be C*H*W)."""
    return x.reshape(x.shape[0], channels, height, width)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input.

    Parameter count: ``in_features * num_classes + num_classes``;
    7,850 for the defaults (784 * 10 + 10).

    Args:
        in_features: Number of input features after flattening each sample.
        num_classes: Number of classes (logits returned, no softmax).
    """

    def __init__(self, in_features: int = 784, num_classes: int = 10) -> None:
        super().__init__()
        _check_positive_int("in_features", in_features)
        _check_positive_int("num_classes", num_classes)
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]``."""
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Fully connected ReLU network; the defaults are McMahan et al. 2017's "2NN".

    McMahan et al. 2017 (Communication-Efficient Learning of Deep Networks from
    Decentralized Data, §3): "A simple multilayer-perceptron with 2-hidden layers
    with 200 units each using ReLu activations (199,210 total parameters)".

    Parameter count for the defaults (784-200-200-10):
    ``784*200 + 200 + 200*200 + 200 + 200*10 + 10 = 157,000 + 40,200 + 2,010 = 199,210``.

    With ``norm="layer"`` each hidden ``Linear`` is followed by an ``nn.LayerNorm`` over its
    output (elementwise affine: a weight and a bias of the layer's width) and then the ReLU, so
    the defaults gain ``2*200 + 2*200 = 800`` parameters: ``199,210 + 800 = 200,010``. The
    layers are then ``net.0`` Linear, ``net.1`` LayerNorm, ``net.2`` ReLU, ... and the output
    layer is ``net.{3 * len(hidden)}`` (``net.6`` for the defaults; ``net.{2 * len(hidden)}``,
    ``net.4``, without normalization, as before). LayerNorm has no running statistics, so the
    net trains on the ``vmap`` backend; FedBN keeps its affine parameters local.

    Args:
        in_features: Number of input features after flattening each sample.
        hidden: Widths of the hidden layers (each followed by ReLU); may be empty.
        num_classes: Number of output logits.
        norm: ``None`` (default: no normalization, the 2NN) or ``"layer"`` (an
            ``nn.LayerNorm`` after each hidden ``Linear``, before its ReLU).
    """

    NORMS = (None, "layer")

    def __init__(
        self,
        in_features: int = 784,
        hidden: tuple[int, ...] | list[int] = (200, 200),
        num_classes: int = 10,
        norm: str | None = None,
    ) -> None:
        super().__init__()
        _check_positive_int("in_features", in_features)
        _check_positive_int("num_classes", num_classes)
        for h in hidden:
            _check_positive_int("hidden", h)
        if norm not in self.NORMS:
            raise ValueError(f"norm: {norm!r} is not one of {self.NORMS} (None: no normalization; "
                             f"'layer': nn.LayerNorm after each hidden Linear)")
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), *([nn.LayerNorm(h)] if norm == "layer" else []), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]``."""
        return self.net(x.flatten(1))


class McMahanMNISTCNN(nn.Module):
    """McMahan et al. 2017's MNIST "CNN".

    Paper (§3): "A CNN with two 5x5 convolution layers (the first with 32
    channels, the second with 64, each followed with 2x2 max pooling), a fully
    connected layer with 512 units and ReLu activation, and a final softmax
    output layer (1,663,370 total parameters)." The quoted count is reached
    exactly with "same" convolutions (padding 2) on 28x28 inputs, so the
    poolings take 28 -> 14 -> 7 (TensorFlow Federated's
    ``create_original_fedavg_cnn_model`` is the same network). ReLU follows each
    convolution.

    Parameter count (in_channels=1, num_classes=10):

    - conv1 ``5*5*1*32 + 32 = 832``
    - conv2 ``5*5*32*64 + 64 = 51,264``
    - fc1 ``7*7*64*512 + 512 = 1,606,144``
    - fc2 ``512*10 + 10 = 5,130``
    - total ``1,663,370``

    Args:
        in_channels: Image channels; each sample is reshaped to
            ``[in_channels, 28, 28]``.
        num_classes: Number of output logits (10 for MNIST, 62 for EMNIST).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("num_classes", num_classes)
        self.in_channels = in_channels
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (28x28 images)."""
        x = _as_images(x, self.in_channels, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def _tf_same_max_pool_3x3_s2(x: Tensor) -> Tensor:
    """TensorFlow ``max_pool(ksize=3, strides=2, padding='SAME')`` on ``[B, C, H, W]``.

    TF pads ``max((ceil(n/2) - 1) * 2 + 3 - n, 0)`` positions per spatial axis,
    the smaller half before and the larger half after, with -inf; PyTorch's
    ``padding=1`` would pad symmetrically and shift the windows by one.
    """
    pads: list[int] = []
    for n in (x.shape[-1], x.shape[-2]):  # F.pad order: last dim first
        total = max((math.ceil(n / 2) - 1) * 2 + 3 - n, 0)
        pads += [total // 2, total - total // 2]
    x = F.pad(x, pads, value=float("-inf"))
    return F.max_pool2d(x, kernel_size=3, stride=2)


class McMahanCIFARCNN(nn.Module):
    """The TensorFlow CIFAR-10 tutorial model that McMahan et al. 2017 used.

    McMahan et al. 2017 (§3, CIFAR experiments): "The model architecture was
    taken from the TensorFlow tutorial, which consists of two convolutional
    layers followed by two fully connected layers and then a linear
    transformation layer to produce logits, for a total of about 10^6
    parameters." The tutorial (``cifar10.py``, ``inference``) is::

        conv1 5x5x3x64 SAME + ReLU -> max_pool 3x3/2 SAME -> LRN
        conv2 5x5x64x64 SAME + ReLU -> LRN -> max_pool 3x3/2 SAME
        local3 FC 384 + ReLU -> local4 FC 192 + ReLU -> softmax_linear FC 10

    with LRN ``depth_radius=4, bias=1.0, alpha=0.001/9, beta=0.75``, which is
    ``nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0)`` (PyTorch
    divides alpha by the window size, TF does not). Pooling follows TF's SAME
    alignment (padding after, not both sides).

    The paper trains on 24x24 crops; lfed's default is the full 32x32 image
    (``image_size=32``), which changes only local3's input width
    (``64 * ceil(ceil(s/2)/2)**2``).

    Parameter count (num_classes=10):

    - conv1 ``5*5*3*64 + 64 = 4,864``; conv2 ``5*5*64*64 + 64 = 102,464``
    - local3, 32x32 input: ``8*8*64*384 + 384 = 1,573,248``;
      24x24 input: ``6*6*64*384 + 384 = 885,120``
    - local4 ``384*192 + 192 = 73,920``; logits ``192*10 + 10 = 1,930``
    - total: **1,756,426** at 32x32, **1,068,298** at 24x24 (the paper's "about
      10^6").

    Args:
        num_classes: Number of output logits.
        image_size: Side of the square RGB input; samples are reshaped to
            ``[3, image_size, image_size]``.
        lrn: Keep the tutorial's local response normalisation layers (they have
            no parameters); ``False`` drops them.
    """

    def __init__(self, num_classes: int = 10, image_size: int = 32, lrn: bool = True) -> None:
        super().__init__()
        _check_positive_int("num_classes", num_classes)
        _check_positive_int("image_size", image_size)
        self.image_size = image_size
        self.use_lrn = bool(lrn)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(64, 64, kernel_size=5, padding=2)
        self.norm = nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0)
        side = math.ceil(math.ceil(image_size / 2) / 2)
        self.fc1 = nn.Linear(side * side * 64, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (3 x s x s images)."""
        x = _as_images(x, 3, self.image_size, self.image_size)
        x = _tf_same_max_pool_3x3_s2(F.relu(self.conv1(x)))
        if self.use_lrn:
            x = self.norm(x)
        x = F.relu(self.conv2(x))
        if self.use_lrn:
            x = self.norm(x)
        x = _tf_same_max_pool_3x3_s2(x)
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class ReddiEMNISTCNN(nn.Module):
    """Reddi et al. 2021 (Adaptive Federated Optimization) EMNIST CNN.

    Reddi et al. 2021, appendix (EMNIST character-recognition model):
    Conv2d 3x3 32 (valid) -> Conv2d 3x3 64 (valid) -> MaxPool 2x2 ->
    Dropout 0.25 -> Flatten -> Dense 128 -> Dropout 0.5 -> Dense 62; ReLU after both convolutions and
    the 128-unit layer (as in TensorFlow Federated's
    ``create_conv_dropout_model``). 28x28 inputs: 28 -> 26 -> 24 -> pool 12.

    Parameter count (num_classes=62):

    - conv1 ``3*3*1*32 + 32 = 320``
    - conv2 ``3*3*32*64 + 64 = 18,496``
    - fc1 ``12*12*64*128 + 128 = 1,179,776``
    - fc2 ``128*62 + 62 = 7,998``
    - total ``1,206,590`` (with num_classes=10: ``1,199,882``)

    Args:
        num_classes: Number of output logits (62 for EMNIST "byclass").
        dropout: Keep the two dropout layers; ``False`` removes them (the
            parameter count is the same). In training mode under ``vmap``
            dropout needs ``randomness="different"``.
    """

    def __init__(self, num_classes: int = 62, dropout: bool = True) -> None:
        super().__init__()
        _check_positive_int("num_classes", num_classes)
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.drop1: nn.Module = nn.Dropout(0.25) if dropout else nn.Identity()
        self.fc1 = nn.Linear(12 * 12 * 64, 128)
        self.drop2: nn.Module = nn.Dropout(0.5) if dropout else nn.Identity()
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (28x28 images)."""
        x = _as_images(x, 1, 28, 28)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.drop1(F.max_pool2d(x, 2))
        x = self.drop2(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


class CharLSTM(nn.Module):
    """Next-character LSTM for Shakespeare (LEAF; McMahan et al. 2017; Reddi et al. 2021).

    Embedding (``vocab_size`` x ``embed_dim``) -> ``num_layers``-layer LSTM with
    ``hidden`` units -> linear to ``vocab_size`` logits, read at the last time
    step: input is a long tensor ``[B, L]`` (L = 80 in LEAF), output the logits
    ``[B, vocab_size]`` of the character that follows.

    Parameter count for the defaults (80, 8, 256, 2):

    - embedding ``80*8 = 640``
    - LSTM layer 1 ``4*256*(8 + 256) + 2*4*256 = 270,336 + 2,048 = 272,384``
    - LSTM layer 2 ``4*256*(256 + 256) + 2*4*256 = 524,288 + 2,048 = 526,336``
    - output ``256*80 + 80 = 20,560``
    - total ``819,920``

    PyTorch's LSTM has two bias vectors per layer (``b_ih`` and ``b_hh``);
    Keras/LEAF's has one, so their count for the same network is
    ``num_layers * 4 * hidden = 2,048`` lower (817,872). The two are the same
    function family (the two biases only ever appear as their sum).

    ``nn.LSTM`` has no ``vmap`` batching rule. With ``unrolled=True`` the
    forward pass computes the same LSTM (same parameters, same gate order
    i, f, g, o) with explicit matrix products over the time steps, which
    ``torch.func.vmap`` can batch over clients.

    Args:
        vocab_size: Number of characters (embedding rows and output logits).
        embed_dim: Embedding width.
        hidden: LSTM hidden size.
        num_layers: Stacked LSTM layers.
        unrolled: Compute the LSTM step by step (vmap-compatible) instead of
            calling the fused ``nn.LSTM`` kernel.
    """

    def __init__(
        self,
        vocab_size: int = 80,
        embed_dim: int = 8,
        hidden: int = 256,
        num_layers: int = 2,
        unrolled: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("embed_dim", embed_dim),
            ("hidden", hidden),
            ("num_layers", num_layers),
        ):
            _check_positive_int(name, value)
        self.unrolled = bool(unrolled)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=num_layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab_size)

    def _unrolled_lstm(self, x: Tensor) -> Tensor:
        """Top layer's last hidden state ``[B, H]`` for ``x`` of shape ``[B, L, E]``."""
        lstm = self.lstm
        batch, length = x.shape[0], x.shape[1]
        inputs = x
        h = x.new_zeros(batch, lstm.hidden_size)
        for layer in range(lstm.num_layers):
            w_ih = getattr(lstm, f"weight_ih_l{layer}")
            w_hh = getattr(lstm, f"weight_hh_l{layer}")
            bias = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
            # The input projection of every time step at once: [B, L, 4H].
            gates_x = inputs @ w_ih.T + bias
            h = x.new_zeros(batch, lstm.hidden_size)
            c = x.new_zeros(batch, lstm.hidden_size)
            outputs = []
            for t in range(length):
                gates = gates_x[:, t] + h @ w_hh.T
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            inputs = torch.stack(outputs, dim=1)
        return h

    def forward(self, x: Tensor) -> Tensor:
        """Next-character logits ``[B, vocab_size]`` for character ids ``[B, L]``."""
        emb = self.embedding(x.reshape(x.shape[0], -1))
        if self.unrolled:
            last = self._unrolled_lstm(emb)
        else:
            out, _ = self.lstm(emb)
            last = out[:, -1]
        return self.fc(last)


class SmallCNN(nn.Module):
    """A small CNN for scikit-learn's 8x8 digits (fast end-to-end tests).

    conv 3x3 16 (pad 1) + ReLU -> max-pool 2 (8 -> 4) -> conv 3x3 32 (pad 1) +
    ReLU -> max-pool 2 (4 -> 2) -> linear to ``num_classes``.

    Parameter count (num_classes=10): ``3*3*1*16 + 16 = 160``;
    ``3*3*16*32 + 32 = 4,640``; ``2*2*32*10 + 10 = 1,290``; total ``6,090``.

    Args:
        num_classes: Number of output logits.
        in_channels: Image channels; samples are reshaped to ``[in_channels, 8, 8]``.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        _check_positive_int("num_classes", num_classes)
        _check_positive_int("in_channels", in_channels)
        self.in_channels = in_channels
        self.conv1 = nn.Conv2d(in_channels, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc = nn.Linear(2 * 2 * 32, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, num_classes]`` for input ``[B, *sample_shape]`` (8x8 images)."""
        x = _as_images(x, self.in_channels, 8, 8)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class _CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with explicit products (``vmap``-able): ``qkv`` then ``proj``."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        B, L, D = x.shape
        H = self.num_heads
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, L, H, D // H).transpose(1, 2) for t in (q, k, v))  # [B, H, L, D/H]
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, L, D))


class _MLPBlock(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Block(nn.Module):
    """Pre-norm transformer block: ``h + attn(ln1(h))``, then ``h + mlp(ln2(h))``."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _CausalSelfAttention(d_model, num_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = _MLPBlock(d_model, d_ff)

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class CharTransformer(nn.Module):
    """A small causal (GPT-style, pre-norm) transformer for next-character prediction (LEAF Shakespeare).

    Character embedding + learned position embedding -> ``num_layers`` blocks (causal multi-head
    self-attention ``attn.qkv``/``attn.proj``, GELU MLP ``mlp.fc1``/``mlp.fc2``, LayerNorm before
    each) -> LayerNorm -> linear ``head`` to ``vocab_size`` logits. :meth:`forward` reads the last
    position (input ``long [B, L]``, ``L <= seq_len``; output ``[B, vocab_size]``, the character that
    follows, as the federated task needs); :meth:`forward_all` gives every position's logits
    ``[B, L, vocab_size]`` (central pretraining on all positions, ``scripts/pretrain_shakespeare.py``).
    Attention is written with plain matrix products and a causal mask, so the model runs under
    ``torch.func.vmap`` (and ``lfed.models.adapters.LoRA`` can adapt ``attn.qkv``, ``attn.proj``,
    ``mlp.fc1``, ``mlp.fc2``).

    Parameter count for the defaults (vocab 80, seq_len 80, d_model 128, 4 layers, 4 heads, d_ff 512):

    - embeddings ``80*128 + 80*128 = 20,480``
    - per block: LayerNorms ``2 * 2*128 = 512``; ``qkv`` ``128*384 + 384 = 49,536``; ``proj``
      ``128*128 + 128 = 16,512``; ``fc1`` ``128*512 + 512 = 66,048``; ``fc2`` ``512*128 + 128 = 65,664``;
      ``198,272`` per block, ``793,088`` for 4
    - final LayerNorm ``256``; head ``128*80 + 80 = 10,320``
    - total ``824,144``

    Args:
        vocab_size: Characters (embedding rows and output logits).
        seq_len: Longest input (rows of the position embedding).
        d_model: Width of the residual stream.
        num_layers: Transformer blocks.
        num_heads: Attention heads (must divide ``d_model``).
        d_ff: Hidden width of each block's MLP.
    """

    def __init__(self, vocab_size: int = 80, seq_len: int = 80, d_model: int = 128, num_layers: int = 4,
                 num_heads: int = 4, d_ff: int = 512) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len), ("d_model", d_model),
                            ("num_layers", num_layers), ("num_heads", num_heads), ("d_ff", d_ff)):
            _check_positive_int(name, value)
        if d_model % num_heads:
            raise ValueError(f"num_heads: must divide d_model ({d_model}), got {num_heads}")
        self.seq_len = seq_len
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(0.02 * torch.randn(seq_len, d_model))
        self.blocks = nn.ModuleList([_Block(d_model, num_heads, d_ff) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def _hidden(self, x: Tensor) -> Tensor:
        """The last block's output ``[B, L, d_model]`` for character ids ``[B, L]``."""
        x = x.reshape(x.shape[0], -1)
        L = x.shape[1]
        if L > self.seq_len:
            raise ValueError(f"x: sequences of {L} characters, longer than seq_len={self.seq_len}")
        h = self.embedding(x) + self.position[:L]
        for block in self.blocks:
            h = block(h)
        return h

    def forward_all(self, x: Tensor) -> Tensor:
        """Next-character logits at every position, ``[B, L, vocab_size]`` for character ids ``[B, L]``."""
        return self.head(self.norm(self._hidden(x)))

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[B, vocab_size]`` of the character that follows ``x`` (ids ``[B, L]``)."""
        return self.head(self.norm(self._hidden(x)[:, -1]))


MODELS: dict[str, type[nn.Module]] = {
    "logistic": LogisticRegression,
    "mlp": MLP,
    "mcmahan_mnist_cnn": McMahanMNISTCNN,
    "mcmahan_cifar_cnn": McMahanCIFARCNN,
    "reddi_emnist_cnn": ReddiEMNISTCNN,
    "char_lstm": CharLSTM,
    "small_cnn": SmallCNN,
    "char_transformer": CharTransformer,
}
"""Model name -> class, for :func:`build_model` and configs that name a model."""


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Build a model by name.

    Args:
        name: A key of :data:`MODELS` (``"mlp"``, ``"mcmahan_mnist_cnn"``, ...).
        **kwargs: Passed to the model's constructor.

    Returns:
        The constructed model.

    Raises:
        ValueError: If ``name`` is not a known model.
    """
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name](**kwargs)
