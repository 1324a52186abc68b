"""The papers' next-character language models for Shakespeare: an LSTM (:class:`CharLSTM`, with an unrolled form that
vmaps) and a small causal transformer (:class:`CharTransformer`). Parameter counts are worked out in each docstring (held
by ``tests/models/test_zoo.py``); the catalogue of every model by name: :mod:`lfed.models.zoo`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lfed.checks import integer

__all__ = ["CharLSTM", "CharTransformer"]


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
            integer(name, value, at_least=1)
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
            integer(name, value, at_least=1)
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
