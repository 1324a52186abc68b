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

The models live by family: the dense ones here (:class:`LogisticRegression`, :class:`MLP`), the convolutional ones in
:mod:`lfed.models.convnets`, the language models in :mod:`lfed.models.language`; every name is importable from here
(``lfed.models.zoo.CharTransformer``, the paths configs name) and listed by name in :data:`MODELS`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lfed.checks import integer
from lfed.models.convnets import McMahanCIFARCNN, McMahanMNISTCNN, ReddiEMNISTCNN, SmallCNN
from lfed.models.language import CharLSTM, CharTransformer

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
        integer("in_features", in_features, at_least=1)
        integer("num_classes", num_classes, at_least=1)
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
        integer("in_features", in_features, at_least=1)
        integer("num_classes", num_classes, at_least=1)
        for h in hidden:
            integer("hidden", h, at_least=1)
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
