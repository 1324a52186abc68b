"""Stateless per-round random generators.

Every random choice lfed makes in a round (which clients are sampled, which of
them straggle, which mini-batches they draw, which examples estimate the Fisher
diagonal) comes from a generator seeded by ``(seed, round, stream)`` alone. No
RNG state is carried from one round to the next, so a run resumed from a
checkpoint at round ``r`` draws exactly what the uninterrupted run drew in round
``r`` (DESIGN.md, "All state is module state"), and the streams do not interfere
with each other: turning on stragglers does not change which clients are
sampled.

Streams used by lfed: ``"sample"``, ``"stragglers"``, ``"batches"``,
``"fisher"``, ``"dropout"`` and ``"fisher_dropout"`` (:func:`seeded_global_rng`: layers such as dropout
draw from torch's global generator, which lfed reseeds per round and restores
afterwards). Any other non-empty name is allowed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch

__all__ = ["STREAMS", "derive_seed", "round_generator", "seeded_global_rng"]

#: The stream names lfed itself uses.
STREAMS: tuple[str, ...] = ("sample", "stragglers", "batches", "fisher")

_MASK_63 = (1 << 63) - 1


def _check_int(name: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def derive_seed(seed: int, round: int, stream: str) -> int:
    """Derive a 63-bit seed from ``(seed, round, stream)``.

    The seed is the first 8 bytes of ``blake2b("lfed/<seed>/<round>/<stream>")``
    read as a big-endian integer with the top bit cleared, so it is a valid
    non-negative ``torch.Generator.manual_seed`` argument, identical across
    platforms and Python processes (no ``hash()`` randomisation).

    Args:
        seed: The run's seed (any int, negative allowed).
        round: The round index, ``>= 0``.
        stream: The name of the random stream, non-empty.

    Returns:
        An int in ``[0, 2**63)``.

    Raises:
        ValueError: If ``seed`` or ``round`` is not an int, ``round < 0`` or
            ``stream`` is not a non-empty string.
    """
    _check_int("seed", seed)
    _check_int("round", round, minimum=0)
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream must be a non-empty str such as one of {STREAMS}, got {stream!r}")
    digest = hashlib.blake2b(f"lfed/{seed}/{round}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK_63


def round_generator(
    seed: int, round: int, stream: str, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A fresh generator for one round and one stream.

    Args:
        seed: The run's seed.
        round: The round index, ``>= 0``.
        stream: The stream name (``"sample"``, ``"stragglers"``, ``"batches"``,
            ``"fisher"``, or any other non-empty name).
        device: Device of the generator; tensors drawn with it must live there.

    Returns:
        A ``torch.Generator`` on ``device`` seeded with
        :func:`derive_seed` ``(seed, round, stream)``.

    Example:
        >>> g1 = round_generator(0, 3, "sample")
        >>> g2 = round_generator(0, 3, "sample")
        >>> bool((torch.rand(4, generator=g1) == torch.rand(4, generator=g2)).all())
        True
    """
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(derive_seed(seed, round, stream))
    return generator


@contextlib.contextmanager
def seeded_global_rng(seed: int, round: int, stream: str, device: str | torch.device = "cpu") -> Iterator[None]:
    """Seed torch's global generators from ``(seed, round, stream)`` inside the block only.

    Randomness that a model draws itself (dropout inside local training, under ``vmap`` with
    ``randomness="different"`` or in the loop backend) comes from torch's global CPU generator
    and the global generator of ``device``. Inside the block both are seeded with
    :func:`derive_seed` ``(seed, round, stream)``; on exit their previous states are restored,
    so the caller's random sequence is untouched and a resumed run draws the same masks in
    round ``r`` as the uninterrupted one.

    Args:
        seed: The run's seed.
        round: The round index, ``>= 0``.
        stream: The stream name, e.g. ``"dropout"``.
        device: The device whose global generator is also seeded (besides the CPU's).
    """
    s = derive_seed(seed, round, stream)
    device = torch.device(device)
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(s)
            yield
        return
    backend = getattr(torch, device.type)
    index = device.index if device.index is not None else backend.current_device()
    with torch.random.fork_rng(devices=[index], device_type=device.type):
        torch.random.default_generator.manual_seed(s)
        with backend.device(index):
            backend.manual_seed(s)
        yield
