"""Stateless per-round random generators.

Every random choice lfed makes in a round (which clients are sampled, which of
them straggle, which mini-batches they draw, which examples estimate the Fisher
diagonal) comes from a generator seeded by ``(seed, round, stream)`` alone. No
RNG state is carried from one round to the next, so a run resumed from a
checkpoint at round ``r`` draws exactly what the uninterrupted run drew in round
``r`` (docs/reproducibility.md), and the streams do not interfere
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
import math
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["NOISE_MODES", "PrivateStreams", "STREAMS", "derive_seed", "round_generator", "seeded_global_rng"]

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


def _shared_secret_seed() -> int:
    """63 bits of the operating system's cryptographic randomness; with several processes (DDP), rank 0's, sent to
    every rank (a collective: every rank draws its private streams in the same order), so all draw the same noise."""
    seed = secrets.randbits(63)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = int(box[0])
    return seed


#: Where differential privacy's draws come from (:class:`PrivateStreams`).
NOISE_MODES = ("seeded", "secure")


@dataclass(frozen=True)
class PrivateStreams:
    """Where a DP run's private draws come from: its noise and its Poisson cohort (docs/privacy.md "Noise modes").

    * ``seeded`` (the default): from ``(seed, round, "<stream>/<key>")`` like every other stream, so a run is
      reproducible and resumes bit for bit. Anyone who knows the seed and ``key`` can regenerate the noise and
      subtract it: the guarantee then holds only against an adversary who does not know the seed. ``key``
      (:attr:`lfed.core.run.FederatedRun.stream_key`, a digest of the run's settings) keeps runs of other settings
      (the members of a grid) on distinct streams at equal seeds; ``""`` (``common_noise: true``) shares them.
    * ``secure``: every generator is seeded with 63 bits from the operating system's cryptographic randomness
      (:func:`secrets.randbits`), drawn afresh for every round and stream and kept nowhere, so nothing logged or
      checkpointed regenerates the noise or the cohort (with several processes, rank 0 draws and sends it to the
      others, so every rank draws the same). As Opacus's ``secure_mode``, each Gaussian is the sum of
      4 draws divided by 2 (:meth:`normal`), which blunts the floating-point attacks on a single draw (Holohan and
      Braghin 2021). What it gives up: a resumed run continues with fresh noise, not the stream it would have drawn.
    """

    mode: str = "seeded"
    key: str = ""

    def __post_init__(self) -> None:
        if self.mode not in NOISE_MODES:
            raise ValueError(f"noise: {self.mode!r} is not one of {NOISE_MODES}")

    @property
    def secure(self) -> bool:
        return self.mode == "secure"

    def generator(self, seed: int, round: int, stream: str, device: str | torch.device = "cpu") -> torch.Generator:
        """The generator of ``stream`` in ``round`` (module docstring)."""
        if self.secure:
            g = torch.Generator(device=torch.device(device))
            g.manual_seed(_shared_secret_seed())
            return g
        return round_generator(seed, round, f"{stream}/{self.key}" if self.key else stream, device)

    def normal(self, shape: tuple[int, ...] | int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
        """Standard normal draws of ``shape`` on the generator's device: one draw each (seeded), or the sum of 4 divided
        by 2 (secure)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        device = generator.device
        if not self.secure:
            return torch.randn(shape, generator=generator, dtype=dtype, device=device)
        total = torch.randn(shape, generator=generator, dtype=dtype, device=device)
        for _ in range(3):
            total += torch.randn(shape, generator=generator, dtype=dtype, device=device)
        return total / math.sqrt(4)
