"""LoRA adapters on a frozen base (docs/algorithms.md §12): the net's chosen linear layers get rank-r adapters, the rest is frozen.

LoRA (Hu et al. 2021): a frozen linear layer ``W₀ [d_out, d_in]`` (and its bias ``b₀``) becomes

    h = W₀ x + b₀ + (α/r) B A x,    A [r, d_in] Kaiming-uniform (seeded),  B [d_out, r] zero,

so the adapted net starts as the base. The layers come from Hugging Face's ``peft`` library
(``peft.inject_adapter_in_model`` with a ``LoraConfig``; ``pip install 'lfed[adapters]'``): they
run under ``torch.func.functional_call`` and ``vmap`` with the adapters as the only stacked
parameters (``tests/models/test_adapters.py`` trains them on both backends against the formulas).

Only the adapters are trainable (``requires_grad``), so lfed's flat vector ``P`` counts them alone
(:class:`lfed.engine.params.ParamLayout`): the cohort trains ``[K, P]`` adapter rows over one copy of the
base on the device, and clients upload, compress and keep state for adapters only. The server's
choices (docs/adapters.md):

* FedAvg of A and B (``freeze_a: false``, the default; FedIT): ``A ← Σ a_k A_k``, ``B ← Σ a_k B_k``.
  ``mean(B)·mean(A) ≠ mean(B_k A_k)``: the aggregate is not the average of the clients' changes.
* FFA-LoRA (Sun et al. 2024; ``freeze_a: true``): ``A`` stays at its shared seeded initialisation
  (a frozen parameter, not part of ``P``), only ``B`` trains and is averaged, and then
  ``(α/r) mean(B_k) A = mean((α/r) B_k A)`` exactly.

Both are lfed's plain FedAvg round over the trainable parameters; which parameters train is the
net's choice, made here.

Configured from YAML as a wrapper of any net::

    model:
      net:
        class_path: lfed.models.adapters.LoRA
        init_args:
          net: {class_path: lfed.models.zoo.MLP, init_args: {in_features: 64, hidden: [64], num_classes: 10}}
          rank: 4
          alpha: 8
          target: ["net.*"]          # fnmatch patterns on the net's module names (nn.Linear layers)
          train: []                  # base parameters trained in full beside the adapters (a head)
          freeze_a: false            # true: FFA-LoRA
          base_checkpoint: base.pt   # the pretrained base (optional), loaded at the run's set-up

:class:`Pretrained` is the same without adapters: a pretrained net trained in full, or with some of
its parameters frozen (full fine-tuning, the baseline of adapters).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lfed.checks import integer, name_matches, number

__all__ = ["LoRA", "Pretrained", "load_base", "lora_targets"]

#: peft's name for lfed's one adapter.
ADAPTER = "default"


def lora_targets(net: nn.Module, target: Sequence[str]) -> list[str]:
    """The names of ``net``'s ``nn.Linear`` layers that match any ``fnmatch`` pattern of ``target``.

    Raises:
        ValueError: If no linear layer matches (naming the net's linear layers).
    """
    if isinstance(target, str) or not isinstance(target, Sequence) or not target or not all(isinstance(t, str) for t in target):
        raise ValueError(f"target: a non-empty list of module-name patterns (fnmatch, e.g. ['*.fc*', 'blocks.*.attn.*']), got {target!r}")
    linear = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    matched = [name for name in linear if name and any(fnmatch.fnmatchcase(name, p) for p in target)]
    if not matched:
        shown = ", ".join(linear[:12]) + (f", ... ({len(linear)} in all)" if len(linear) > 12 else "")
        about = f"its linear layers are: {shown}" if linear else "it has no nn.Linear layer (LoRA adapts nn.Linear layers)"
        if "" in linear:
            about += " (the net itself is one: wrap it, e.g. in nn.Sequential, to adapt it)"
        raise ValueError(f"target: no linear layer of {type(net).__name__} matches {list(target)}; {about}")
    return matched


def _trained_in_full(net: nn.Module, train: Sequence[str], adapted: list[str]) -> set[str]:
    """The base's parameters matching a pattern of ``train`` (none of an adapted layer's)."""
    if isinstance(train, str) or not isinstance(train, Sequence) or not all(isinstance(t, str) for t in train):
        raise ValueError(f"train: a list of parameter-name patterns (fnmatch, e.g. ['fc.*']), got {train!r}")
    names = [n for n, _ in net.named_parameters()]
    out = set()
    for pattern in train:
        hits = name_matches("train", names, pattern, f"parameter of {type(net).__name__}")
        clash = [n for n in hits if n.rsplit(".", 1)[0] in adapted]
        if clash:
            raise ValueError(f"train: {pattern!r} matches {clash[0]}, a weight of an adapted layer (its frozen W₀); "
                             "leave the layer out of target to train it in full")
        out.update(hits)
    return out


def _read_state(path: Path) -> dict[str, Tensor]:
    """A net's state dict from ``path``: a saved ``state_dict()``, or a Lightning/lfed checkpoint's ``net.*`` entries."""
    obj = torch.load(path, map_location="cpu", weights_only=False)  # the user's own file (a Lightning checkpoint holds more than tensors)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        state = obj["state_dict"]
        net = {k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")}
        if not net:
            raise ValueError(f"base_checkpoint: {path} is a checkpoint with no 'net.*' entries (not an lfed run's)")
        return net
    if isinstance(obj, dict) and obj and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        return obj
    raise ValueError(f"base_checkpoint: {path} holds a {type(obj).__name__}, not a state dict (torch.save(net.state_dict(), path)) "
                     "or an lfed checkpoint")


def load_base(net: nn.Module, path: str | Path) -> None:
    """Load the pretrained base ``path`` into ``net`` (every entry, same shapes), or say exactly why it does not fit.

    Raises:
        FileNotFoundError: If there is no file at ``path``.
        ValueError: If the file is not a state dict of ``net``: the missing and unexpected entries and the shapes that differ.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"base_checkpoint: no file at {path}")
    given = _read_state(path)
    own = net.state_dict()
    missing = [k for k in own if k not in given]
    unexpected = [k for k in given if k not in own]
    shapes = [f"{k} (file {list(given[k].shape)}, model {list(v.shape)})" for k, v in own.items()
              if k in given and tuple(given[k].shape) != tuple(v.shape)]
    if missing or unexpected or shapes:
        parts = []
        for what, items in (("missing", missing), ("unexpected", unexpected), ("shapes differ", shapes)):
            if items:
                parts.append(f"{what}: {', '.join(items[:6])}" + (f", ... ({len(items)} in all)" if len(items) > 6 else ""))
        label = getattr(net, "label", type(net).__name__)
        raise ValueError(f"base_checkpoint: {path} does not fit {label}: " + "; ".join(parts))
    net.load_state_dict(given)


class _BaseView:
    """The base of an adapted net under its own (unadapted) state-dict names, for :func:`load_base`."""

    def __init__(self, net: nn.Module, names: dict[str, str]) -> None:
        self.net, self.names = net, names
        self.label = type(net).__name__

    def state_dict(self) -> dict[str, Tensor]:
        own = self.net.state_dict()
        return {k: own[v] for k, v in self.names.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        own = self.net.state_dict()  # references to the net's tensors
        with torch.no_grad():
            for k, v in state.items():
                own[self.names[k]].copy_(v)


def _peft():
    try:
        import peft
    except ImportError as e:  # an optional dependency: the core package does not need it
        raise ImportError("lfed.models.adapters.LoRA needs peft (Hugging Face's LoRA layers): pip install 'lfed[adapters]'") from e
    return peft


class LoRA(nn.Module):
    """``net`` with rank-``rank`` LoRA adapters on its linear layers matching ``target``; everything else frozen.

    Args:
        net: The base model (any ``nn.Module``); adapted in place.
        rank: ``r``, the adapters' rank (at most ``min(d_in, d_out)`` of every adapted layer).
        alpha: ``α``; the adapter's output is scaled by ``α / r``.
        target: ``fnmatch`` patterns on ``net``'s module names; every ``nn.Linear`` layer matching one
            is adapted (``["*"]``: all of them).
        freeze_a: FFA-LoRA: keep ``A`` at its seeded initialisation (frozen), train ``B`` only.
        train: ``fnmatch`` patterns on the base's parameter names (as in ``net.named_parameters()``
            before adapting) left trainable in full beside the adapters, e.g. a new classifier head
            (``["net.4.*"]``); they are client weights like the adapters. An adapted layer's own
            weights cannot be listed (they are the frozen ``W₀``).
        seed: Seed of the ``A`` initialisation (Kaiming-uniform, as ``nn.Linear``'s weights; the same for
            every client and every run with this seed), independent of torch's global generator.
        base_checkpoint: A file holding the pretrained base: ``torch.save(net.state_dict(), path)``
            or an lfed checkpoint (its ``net.*`` entries); loaded into ``net`` before the adapters are added.
    """

    def __init__(self, net: nn.Module, rank: int = 4, alpha: float = 8.0, target: Sequence[str] = ("*",),
                 freeze_a: bool = False, seed: int = 0, base_checkpoint: str | None = None,
                 train: Sequence[str] = ()) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise ValueError(f"net: the base model must be an nn.Module, got {type(net).__name__}")
        integer("rank", rank, at_least=1)
        number("alpha", alpha, above=0)
        integer("seed", seed, at_least=0)
        if not isinstance(freeze_a, bool):
            raise ValueError(f"freeze_a: true (FFA-LoRA) or false, got {freeze_a!r}")
        names = lora_targets(net, list(target))
        full = _trained_in_full(net, train, names)
        modules = dict(net.named_modules())
        for name in names:
            layer = modules[name]
            width = min(layer.in_features, layer.out_features)
            if rank > width:
                raise ValueError(f"rank: {rank} is larger than layer {name!r} allows: min(in_features={layer.in_features}, "
                                 f"out_features={layer.out_features}) = {width}; choose rank <= {width} or leave the layer out of target")
        if base_checkpoint is not None and not isinstance(base_checkpoint, (str, Path)):
            raise ValueError(f"base_checkpoint: a file path or None, got {base_checkpoint!r}")
        self._base_names = {k: k for k in net.state_dict()}  # the base's own names -> their names once adapted
        for k in self._base_names:
            layer, _, leaf = k.rpartition(".")
            if layer in names:
                self._base_names[k] = f"{layer}.base_layer.{leaf}"
        peft = _peft()
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", init_lora_weights=True,
                                 target_modules="^(?:" + "|".join(re.escape(n) for n in names) + ")$")
        with torch.random.fork_rng(devices=[]):  # A's draw from its own seed, torch's global generator untouched
            torch.manual_seed(seed)
            net = peft.inject_adapter_in_model(config, net, adapter_name=ADAPTER)
        for pname, p in net.named_parameters():
            trains = ".lora_B." in pname or (".lora_A." in pname and not freeze_a) or pname in full
            p.requires_grad_(trains)
        self.net = net
        self.rank, self.alpha, self.scaling = int(rank), float(alpha), float(alpha) / int(rank)
        self.target, self.adapted, self.freeze_a, self.trained_in_full = list(target), names, freeze_a, sorted(full)
        self.base_checkpoint = None if base_checkpoint is None else str(base_checkpoint)
        self._base_loaded = base_checkpoint is None

    def load_pretrained(self) -> None:
        """Load ``base_checkpoint`` into the frozen base (once; a no-op without one).

        lfed's run calls it at set-up, before its checks of the net and round 0
        (:meth:`lfed.core.run.FederatedRun.setup`), so a config names a base file that exists only by
        then (written by ``scripts/pretrain_shakespeare.py``); a file that does not fit the base
        is refused there. Used outside a run, call it before the first forward pass.
        """
        if self._base_loaded:
            return
        base = _BaseView(self.net, self._base_names)
        load_base(base, self.base_checkpoint)
        self._base_loaded = True

    def adapters(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{layer name: (A [r, d_in], B [d_out, r])}`` of every adapted layer."""
        out = {}
        modules = dict(self.net.named_modules())
        for name in self.adapted:
            layer = modules[name]
            out[name] = (layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight)
        return out

    def base_layer(self, name: str) -> nn.Linear:
        """The frozen base layer ``W₀, b₀`` of the adapted layer ``name``."""
        return dict(self.net.named_modules())[name].base_layer

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """The adapted net's output: every adapted layer computes ``W₀ x + b₀ + (α/r) B A x``."""
        if not self._base_loaded:
            raise RuntimeError(f"LoRA: base_checkpoint {self.base_checkpoint} is not loaded yet; call load_pretrained() first "
                               "(lfed's run does at set-up)")
        return self.net(x, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, freeze_a={self.freeze_a}, adapted={self.adapted}"


class Pretrained(nn.Module):
    """``net`` with its weights from ``base_checkpoint``, the parameters matching ``freeze`` frozen (no adapters).

    Full fine-tuning of a pretrained model (nothing frozen), or a frozen base under trainable parts
    (``freeze: ["embedding.*", "blocks.*"]``). Like :class:`LoRA` the file is loaded at the run's set-up
    (:meth:`load_pretrained`); a file that does not fit ``net`` is refused there.

    Args:
        net: The model (any ``nn.Module``).
        base_checkpoint: ``torch.save(net.state_dict(), path)`` or an lfed checkpoint (its ``net.*`` entries).
        freeze: ``fnmatch`` patterns on ``net``'s parameter names to freeze; each must match one.
    """

    def __init__(self, net: nn.Module, base_checkpoint: str, freeze: Sequence[str] = ()) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise ValueError(f"net: the model must be an nn.Module, got {type(net).__name__}")
        if not isinstance(base_checkpoint, (str, Path)):
            raise ValueError(f"base_checkpoint: a file path, got {base_checkpoint!r}")
        if isinstance(freeze, str) or not isinstance(freeze, Sequence) or not all(isinstance(f, str) for f in freeze):
            raise ValueError(f"freeze: a list of parameter-name patterns (fnmatch), got {freeze!r}")
        names = [n for n, _ in net.named_parameters()]
        frozen = set()
        for pattern in freeze:
            frozen.update(name_matches("freeze", names, pattern, f"parameter of {type(net).__name__}"))
        for n, p in net.named_parameters():
            p.requires_grad_(n not in frozen)
        self.net, self.base_checkpoint, self.frozen = net, str(base_checkpoint), sorted(frozen)
        self._base_loaded = False

    def load_pretrained(self) -> None:
        """Load ``base_checkpoint`` into ``net`` (once)."""
        if not self._base_loaded:
            load_base(self.net, self.base_checkpoint)
            self._base_loaded = True

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """``net``'s output (after :meth:`load_pretrained`)."""
        if not self._base_loaded:
            raise RuntimeError(f"Pretrained: base_checkpoint {self.base_checkpoint} is not loaded yet; call load_pretrained() "
                               "first (lfed's run does at set-up)")
        return self.net(x, *args, **kwargs)
