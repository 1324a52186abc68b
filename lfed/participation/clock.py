"""A simulated clock: how long each client's local work takes, in simulated seconds (issue 40).

Asynchronous training (:mod:`lfed.core.asynchronous`) orders the clients' arrivals at the server by
simulated time, independent of how long the computation takes on this machine. A
:class:`SimulatedClock` gives the duration of one participation of each dispatched client:

* ``constant``: ``d = time_per_step x s_k`` (``s_k`` the client's local steps): every client equally fast.
* ``lognormal`` (the default): ``d = time_per_step x s_k x m_k x j``, with a per-client speed
  ``m_k = exp(speed_sigma z_k)`` drawn once per client and a per-participation jitter
  ``j = exp(jitter_sigma z)`` drawn at each dispatch (``z ~ N(0, 1)``). ``m_k`` is log-normal, so a
  few clients are much slower than the median: the heavy right tail of cross-device durations that
  FedBuff's (Nguyen et al., AISTATS 2022) and FLSim's simulations model.
* ``file``: ``durations_file`` holds one duration per client (one number per line, ``N`` lines, in
  simulated seconds), the duration of every participation of that client.
* ``device``: each client's speed from a device-capacity trace (``device_capacity``: FedScale's
  ``client_device_capacity``, :mod:`lfed.participation.traces`): ``d = compute_factor x e_k x c_k / 1000
  + 2 x bits / 1000 / b_k`` with ``e_k`` the examples the client processes (its local steps x the batch
  size, ``n_k`` when smaller), ``c_k`` its milliseconds per example, ``b_k`` its kilobits per second and
  ``bits`` the model's size (parameters x the bits of their dtype), down and up (FedScale's
  ``get_completion_time``, whose ``augmentation_factor`` 3 is ``compute_factor``).

**Availability windows** (any distribution; ``availability_period`` set): client ``k`` is available
in a periodic window of simulated time, ``[φ_k + n p, φ_k + n p + f p)`` for every integer ``n``
(``p = availability_period``, ``f = availability_fraction``), with a phase ``φ_k = p u_k``,
``u_k ~ U(0, 1)`` drawn once per client (seeded by ``(seed, 0, "clock_window")``): a diurnal cycle with
clients in every time zone. As in FedScale (Lai et al., ICML 2022: ``Client.isActive(cur_time)`` on the
``cur_time % finish_time`` of a periodic availability trace, and the client manager samples only the
clients active at the current time), a client outside its window is **not sampled**; the asynchronous
server dispatches to it once its window opens (:mod:`lfed.core.asynchronous`). A client that started
finishes its work even if its window closes meanwhile (the window governs the start only).

**Availability from a trace** (``trace``, instead of ``availability_period``): client ``k`` is online when the
simulated time modulo its trace's ``finish_time`` falls in one of its ``[active_i, inactive_i)`` intervals
(FedScale's ``client_behave_trace``, :class:`lfed.participation.traces.AvailabilityTrace`), the same rule for the
asynchronous dispatch and the synchronous :class:`~lfed.participation.availability.AvailableSampler`. docs/traces.md.

Every draw is seeded: the speeds by ``(seed, 0, "clock_speed")``, a dispatch's jitter by
``(seed, step, "clock")`` (:func:`lfed.rng.round_generator`), so a run resumed from a checkpoint
draws exactly what the uninterrupted run drew. The clock's state is its time ``now`` (the time of the
last server step), saved in the state dict as ``asynchronous.clock._extra_state``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from lfed.base.component import Component
from lfed.checks import number, one_of
from lfed.rng import round_generator

__all__ = ["DISTRIBUTIONS", "SimulatedClock", "model_bits"]

DISTRIBUTIONS = ("constant", "lognormal", "file", "device")


class SimulatedClock(Component):
    """Durations of the clients' local work in simulated seconds (module docstring).

    Args:
        distribution: ``constant``, ``lognormal``, ``file`` or ``device``.
        time_per_step: Simulated seconds per local step of a client of median speed (> 0).
        speed_sigma: ``lognormal``: standard deviation of ``log m_k`` (per-client speed), >= 0.
        jitter_sigma: ``lognormal``: standard deviation of ``log j`` (per participation), >= 0.
        durations_file: ``file``: a text file of one duration per client (``N`` lines).
        availability_period: Period ``p`` of every client's availability window in simulated seconds (> 0);
            None (the default): every client is always available.
        availability_fraction: Share ``f`` in (0, 1] of the period a client is available.
        trace: An availability trace (FedScale's ``client_behave_trace``, pickle or ``.json``): when each client is
            online; None (the default): ``availability_period``'s windows, or always.
        device_capacity: ``device``: a device-capacity trace (FedScale's ``client_device_capacity``, pickle or
            ``.json``): each client's milliseconds per example and kilobits per second.
        compute_factor: ``device``: the computation's multiple of the trace's forward-pass time (FedScale's 3:
            forward and backward), > 0.
    """

    name = "clock"

    def __init__(self, distribution: Literal["constant", "lognormal", "file", "device"] = "lognormal", time_per_step: float = 1.0,
                 speed_sigma: float = 1.0, jitter_sigma: float = 0.1, durations_file: str | None = None,
                 availability_period: float | None = None, availability_fraction: float = 0.5,
                 trace: str | None = None, device_capacity: str | None = None, compute_factor: float = 3.0) -> None:
        super().__init__()
        one_of("distribution", distribution, DISTRIBUTIONS)
        self.distribution = distribution
        self.time_per_step = number("time_per_step", time_per_step, above=0)
        self.speed_sigma = number("speed_sigma", speed_sigma, at_least=0)
        self.jitter_sigma = number("jitter_sigma", jitter_sigma, at_least=0)
        if (durations_file is None) != (distribution != "file"):
            raise ValueError("durations_file: give it exactly when distribution='file' "
                             f"(got distribution={distribution!r}, durations_file={durations_file!r})")
        self.durations_file = durations_file
        if availability_period is not None:
            availability_period = number("availability_period", availability_period, above=0,
                                         detail=" (simulated seconds) or None (always available)")
        self.availability_period = availability_period
        self.availability_fraction = number("availability_fraction", availability_fraction, above=0, at_most=1)
        if (device_capacity is None) != (distribution != "device"):
            raise ValueError("device_capacity: give it exactly when distribution='device' "
                             f"(got distribution={distribution!r}, device_capacity={device_capacity!r})")
        if trace is not None and availability_period is not None:
            raise ValueError(f"trace: availability comes from the trace {trace!r} or from periodic windows "
                             f"(availability_period={availability_period!r}), not both; give one")
        self.trace = None if trace is None else str(trace)
        self.device_capacity = None if device_capacity is None else str(device_capacity)
        self.compute_factor = number("compute_factor", compute_factor, above=0)
        self._trace: Any = None  # the files, read once (lfed.participation.traces)
        self._device: Any = None
        self.now = 0.0  # simulated seconds at the last server step
        self._speeds: tuple[tuple[int, int], Tensor] | None = None
        self._phases: tuple[tuple[int, int], Tensor] | None = None

    def hparams(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "time_per_step": self.time_per_step,
                "speed_sigma": self.speed_sigma, "jitter_sigma": self.jitter_sigma,
                "durations_file": self.durations_file, "availability_period": self.availability_period,
                "availability_fraction": self.availability_fraction,
                # only when set: the fingerprint of a run made before traces stays the same
                **({"trace": self.trace} if self.trace is not None else {}),
                **({"device_capacity": self.device_capacity, "compute_factor": self.compute_factor}
                   if self.device_capacity is not None else {})}

    # ------------------------------------------------------------------ the trace files
    def availability_trace(self):
        """The :class:`~lfed.participation.traces.AvailabilityTrace` of ``trace`` (read once), or None."""
        if self.trace is not None and self._trace is None:
            from lfed.participation.traces import AvailabilityTrace

            self._trace = AvailabilityTrace(self.trace, "trace")
        return self._trace

    def device(self):
        """The :class:`~lfed.participation.traces.DeviceCapacity` of ``device_capacity`` (read once), or None."""
        if self.device_capacity is not None and self._device is None:
            from lfed.participation.traces import DeviceCapacity

            self._device = DeviceCapacity(self.device_capacity, "device_capacity")
        return self._device

    def check_files(self, num_clients: int) -> None:
        """Read and check every file the clock names, before round 0 (one line naming the file and the field)."""
        if self.distribution == "file":
            read_durations(self.durations_file, num_clients)
        self.availability_trace()
        self.device()

    # ------------------------------------------------------------------ durations
    def speeds(self, seed: int, num_clients: int) -> Tensor:
        """``[N]`` float64 per-client duration multipliers (1 for ``constant``; the file's durations for ``file``)."""
        key = (seed, num_clients)
        if self._speeds is not None and self._speeds[0] == key:
            return self._speeds[1]
        if self.distribution == "constant":
            m = torch.ones(num_clients, dtype=torch.float64)
        elif self.distribution == "lognormal":
            z = torch.randn(num_clients, generator=round_generator(seed, 0, "clock_speed"), dtype=torch.float64)
            m = torch.exp(self.speed_sigma * z)
        elif self.distribution == "file":
            m = read_durations(self.durations_file, num_clients)
        else:
            raise ValueError("distribution='device': durations come from the device capacity, not a speed per client")
        self._speeds = (key, m)
        return m

    def durations(self, clients: Tensor, steps: Tensor, step: int, seed: int, num_clients: int,
                  generator: torch.Generator | None = None, *, num_examples: Tensor | None = None,
                  batch_size: int | None = None, bits: float | None = None) -> Tensor:
        """``[K]`` float64 simulated seconds of the dispatched ``clients`` (host ids) doing ``steps`` local steps,
        dispatched at server step ``step``. The jitter is drawn from ``generator`` when given (a step that dispatches
        in several batches draws them in turn from one generator), else from a fresh ``(seed, step, "clock")`` one.

        ``device`` reads the work itself: ``num_examples`` ``[K]`` the clients' ``n_k``, ``batch_size`` (None: full
        batch) and ``bits``, the model's size (:func:`model_bits`)."""
        clients = clients.detach().cpu().long()
        if self.distribution == "device":
            if num_examples is None or bits is None:
                raise ValueError("distribution='device': durations need num_examples and bits (the model's size)")
            n = num_examples.detach().cpu().to(torch.float64)
            per_step = n if batch_size is None else torch.clamp(n, max=float(batch_size))
            examples = steps.detach().cpu().to(torch.float64) * per_step
            return self.device().durations(clients, examples, bits, self.compute_factor)
        m = self.speeds(seed, num_clients)[clients]
        if self.distribution == "file":
            return m.clone()
        d = self.time_per_step * steps.detach().cpu().to(torch.float64) * m
        if self.distribution == "lognormal" and self.jitter_sigma > 0:
            g = generator if generator is not None else round_generator(seed, step, "clock")
            z = torch.randn(clients.numel(), generator=g, dtype=torch.float64)
            d = d * torch.exp(self.jitter_sigma * z)
        return d

    # ------------------------------------------------------------------ availability windows
    @property
    def windows(self) -> bool:
        """Whether clients have availability windows: a ``trace``, or ``availability_period`` set and
        ``availability_fraction < 1``."""
        return self.trace is not None or (self.availability_period is not None and self.availability_fraction < 1)

    def phases(self, seed: int, num_clients: int) -> Tensor:
        """``[N]`` float64 window phases ``φ_k = p u_k`` (module docstring)."""
        key = (seed, num_clients)
        if self._phases is None or self._phases[0] != key:
            u = torch.rand(num_clients, generator=round_generator(seed, 0, "clock_window"), dtype=torch.float64)
            self._phases = (key, self.availability_period * u)
        return self._phases[1]

    def next_available(self, clients: Tensor, t: float, seed: int, num_clients: int) -> Tensor:
        """``[K]`` float64: ``t`` for the ``clients`` available at time ``t``, else the time their next window opens."""
        clients = clients.detach().cpu().long()
        if not self.windows:
            return torch.full((clients.numel(),), float(t), dtype=torch.float64)
        if self.trace is not None:
            return self.availability_trace().next_available(clients, t)
        p = self.availability_period
        r = torch.remainder(t - self.phases(seed, num_clients)[clients], p)  # time since the last opening, in [0, p)
        return torch.where(r < self.availability_fraction * p, torch.full_like(r, t), t + (p - r))

    # ------------------------------------------------------------------ state
    def get_extra_state(self) -> dict[str, float]:
        return {"now": float(self.now)}

    def set_extra_state(self, state: dict[str, float]) -> None:
        self.now = float(state["now"])


def model_bits(num_params: int, dtype: torch.dtype) -> float:
    """The model's size in bits: ``num_params`` parameters of ``dtype`` (32 each in float32)."""
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return float(num_params) * info.bits


def read_durations(path: str | Path, num_clients: int) -> Tensor:
    """``[N]`` float64 durations from a text file of one positive number per line (blank lines and ``#`` comments skipped)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"durations_file: {str(p)!r} is not a file")
    values = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"durations_file: {p}:{i}: {text!r} is not a number") from None
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"durations_file: {p}:{i}: a duration must be positive and finite, got {v}")
        values.append(v)
    if len(values) != num_clients:
        raise ValueError(f"durations_file: {p} holds {len(values)} durations, the data has {num_clients} clients "
                         "(one per client, one per line)")
    return torch.tensor(values, dtype=torch.float64)
