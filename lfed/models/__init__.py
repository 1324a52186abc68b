"""Models: the papers' models (:mod:`~lfed.models.zoo`), ResNet-20 and ResNet-18 (:mod:`~lfed.models.resnet`) and LoRA adapters on a frozen base
(:mod:`~lfed.models.adapters`). ``lfed.models.MLP`` and the zoo's other names are exported here (imported on first use),
the path configs name."""

from lfed import _lazy_exports

#: 0.4's ``lfed.models`` names, from their module now (imported on first use).
_LAZY = {
    "count_parameters": "lfed.models.zoo",
    "LogisticRegression": "lfed.models.zoo",
    "MLP": "lfed.models.zoo",
    "McMahanMNISTCNN": "lfed.models.zoo",
    "McMahanCIFARCNN": "lfed.models.zoo",
    "ReddiEMNISTCNN": "lfed.models.zoo",
    "CharLSTM": "lfed.models.zoo",
    "SmallCNN": "lfed.models.zoo",
    "CharTransformer": "lfed.models.zoo",
    "ResNet20": "lfed.models.resnet",
    "ResNet18": "lfed.models.resnet",
    "MODELS": "lfed.models.zoo",
    "build_model": "lfed.models.zoo",
}

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
