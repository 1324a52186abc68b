"""Client availability and device speed from traces, in FedScale's formats (issue 65; docs/traces.md).

FedScale (Lai et al., ICML 2022) drives its simulations with two per-client traces, each a pickled dict keyed by
client id; lfed reads both, and the same dicts written as JSON (keys are then strings):

* **availability** (FedScale's ``client_behave_trace``): ``{id: {"active": [a_1, ...], "inactive": [b_1, ...],
  "finish_time": T, ...}}`` in seconds. The trace repeats with period ``T``: the client is online at simulated time
  ``t`` when ``t mod T`` falls in one of its intervals ``[a_i, b_i)`` (FedScale's ``ClientMetadata.is_active`` on
  ``cur_time % finish_time``). Other fields (FedScale's ``duration``, ``model``) are ignored. The intervals must be
  sorted and not overlap (``0 <= a_1 <= b_1 <= a_2 <= ...``); an empty one (``a_i = b_i``) or the part of one past
  ``T`` is never reached and is dropped; a client must be online some time in its period.
* **device capacity** (FedScale's ``client_device_capacity``): ``{id: {"computation": c, "communication": b}}``:
  ``c`` milliseconds per example processed (a forward pass; :class:`~lfed.participation.clock.SimulatedClock`
  multiplies it by ``compute_factor``, FedScale's 3 for forward and backward), ``b`` kilobits per second.

**Client ids.** A trace's ids are sorted (as integers when every id is one, e.g. ``7`` or ``"7"``; else as strings),
and lfed's client ``k`` (``0..N-1``) reads the ``(k mod M)``-th of the ``M`` sorted ids: the first ``N`` when the
trace has at least ``N`` clients, each trace client reused every ``M`` clients when it has fewer (FedScale maps its
clients onto a trace modulo its length the same way).

A pickle is read with an unpickler that builds only plain containers and numbers (and numpy scalars and arrays): a
file that holds anything else is refused, never executed. Every refusal is one line naming the file and the field.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["AvailabilityTrace", "DeviceCapacity", "read_trace_file"]

#: numpy's own pieces a pickle of numbers may name (numpy scalars and arrays): nothing else is built
_NUMPY = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype"),
          ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray")}


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers (and numpy's scalars and arrays); refuses every other class."""

    def __init__(self, file, label: str) -> None:
        super().__init__(file)
        self.label = label

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY:
            return super().find_class(module, name)
        raise ValueError(f"{self.label} holds a Python object ({module}.{name}); lfed reads a pickle of plain dicts, "
                         "lists and numbers (FedScale's), or the same as JSON")


def read_trace_file(path: str | Path, argument: str) -> dict:
    """The dict of a trace file: ``.json``, or a pickle (``.pkl``, ``.pickle`` or any other name), keyed by client id.

    Raises:
        ValueError: One line naming ``argument`` and the file: missing, unreadable, not a dict, or empty.
    """
    p = Path(path)
    label = f"{argument}: {p}"
    if not p.is_file():
        raise ValueError(f"{argument}: {str(p)!r} is not a file")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text())
        else:
            with p.open("rb") as f:
                data = _PlainUnpickler(f, label).load()
    except ValueError as e:
        if str(e).startswith(label):
            raise
        raise ValueError(f"{label}: not a JSON or pickle trace file ({type(e).__name__}: {e})".splitlines()[0]) from None
    except Exception as e:  # a truncated or foreign pickle
        raise ValueError(f"{label}: not a JSON or pickle trace file ({type(e).__name__}: {e})".splitlines()[0]) from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{label}: a trace is a non-empty dict {{client id: fields}}, got {type(data).__name__}"
                         + (" (empty)" if isinstance(data, dict) else ""))
    return data


def _sorted_ids(keys: list) -> list:
    """The ids in lfed's order: as integers when each is one (``7`` or ``"7"``), else as strings."""
    def integral(k: Any) -> bool:
        if isinstance(k, str):
            return k.strip().lstrip("-").isdigit()
        return hasattr(k, "__index__") and not isinstance(k, bool)

    if all(integral(k) for k in keys):
        return sorted(keys, key=lambda k: int(k))
    return sorted(keys, key=str)


def _number(value: Any, label: str, field: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{label}: {field} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{label}: {field} must be finite, got {v}")
    return v


def _numbers(value: Any, label: str, field: str) -> list[float]:
    if hasattr(value, "tolist"):  # a numpy array
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{label}: {field} must be a list of numbers, got {type(value).__name__}")
    return [_number(v, label, f"{field}[{i}]") for i, v in enumerate(value)]


def _fields(entry: Any, label: str, needed: tuple[str, ...]) -> dict:
    if not isinstance(entry, dict):
        raise ValueError(f"{label}: a client's entry must be a dict with {', '.join(needed)}, got {type(entry).__name__}")
    missing = [f for f in needed if f not in entry]
    if missing:
        raise ValueError(f"{label}: missing field {missing[0]!r} (a client's entry needs {', '.join(needed)})")
    return entry


class AvailabilityTrace:
    """When each client is online: FedScale's ``client_behave_trace`` (module docstring), read and checked once.

    Args:
        path: The trace file (``.json`` or a pickle).
        argument: The setting that named it, for the errors.

    The intervals are kept flat (``[E]`` starts and ends, each client's a run of them, ``offsets [M+1]``): a query of
    ``K`` clients costs ``O(K log L)`` (``L`` the most intervals of one client), whatever the trace's size.
    """

    def __init__(self, path: str | Path, argument: str = "trace") -> None:
        raw = read_trace_file(path, argument)
        self.path = str(path)
        self.ids = _sorted_ids(list(raw))
        starts: list[float] = []
        ends: list[float] = []
        offsets = [0]
        finish = []
        for cid in self.ids:
            label = f"{argument}: {path}: client {cid!r}"
            entry = _fields(raw[cid], label, ("active", "inactive", "finish_time"))
            T = _number(entry["finish_time"], label, "finish_time")
            if T <= 0:
                raise ValueError(f"{label}: finish_time (the trace's period, seconds) must be > 0, got {T:g}")
            a = _numbers(entry["active"], label, "active")
            b = _numbers(entry["inactive"], label, "inactive")
            if len(a) != len(b):
                raise ValueError(f"{label}: active and inactive must have one entry per interval, got {len(a)} and {len(b)}")
            previous = 0.0
            kept = 0
            for i, (lo, hi) in enumerate(zip(a, b)):
                if lo < previous:
                    raise ValueError(f"{label}: active[{i}] = {lo:g} comes before "
                                     + ("0" if i == 0 else f"inactive[{i - 1}] = {previous:g}")
                                     + ": intervals must be sorted, not overlapping, from 0")
                if hi < lo:
                    raise ValueError(f"{label}: inactive[{i}] = {hi:g} comes before active[{i}] = {lo:g}")
                previous = hi
                hi = min(hi, T)  # past the period: never reached (t mod T < T)
                if lo < hi:
                    starts.append(lo)
                    ends.append(hi)
                    kept += 1
            if kept == 0:
                raise ValueError(f"{label}: never online in its period [0, {T:g}) (no interval active[i] < inactive[i] "
                                 "before finish_time); leave the client out of the trace")
            offsets.append(offsets[-1] + kept)
            finish.append(T)
        self.starts = torch.tensor(starts, dtype=torch.float64)
        self.ends = torch.tensor(ends, dtype=torch.float64)
        self.offsets = torch.tensor(offsets, dtype=torch.long)
        self.finish = torch.tensor(finish, dtype=torch.float64)
        self._depth = int(max(offsets[i + 1] - offsets[i] for i in range(len(self.ids)))).bit_length() + 1

    @property
    def num_clients(self) -> int:
        """``M``, the trace's clients."""
        return len(self.ids)

    def rows(self, clients: Tensor) -> Tensor:
        """``[K]`` each lfed client's row of the trace: ``k mod M`` (module docstring)."""
        return torch.remainder(clients.detach().cpu().long(), self.num_clients)

    def next_available(self, clients: Tensor, t: float) -> Tensor:
        """``[K]`` float64: ``t`` for the ``clients`` online at ``t``, else the time their next interval opens."""
        m = self.rows(clients)
        T = self.finish[m]
        r = torch.remainder(torch.tensor(float(t), dtype=torch.float64), T)  # the time within the period, [0, T)
        first, end = self.offsets[m], self.offsets[m + 1]
        lo, hi = first.clone(), end.clone()  # bisect each client's run for its first interval opening after r
        last = max(self.starts.numel() - 1, 0)
        for _ in range(self._depth):
            searching = lo < hi
            mid = torch.div(lo + hi, 2, rounding_mode="floor")
            right = searching & (self.starts[mid.clamp(max=last)] <= r)
            lo = torch.where(right, mid + 1, lo)
            hi = torch.where(searching & ~right, mid, hi)
        j = lo - 1  # the last interval opened at or before r (j < first: none)
        online = (j >= first) & (r < self.ends[j.clamp(min=0)])
        following = torch.where(lo < end, self.starts[lo.clamp(max=last)], T + self.starts[first])
        return torch.where(online, torch.full_like(r, float(t)), float(t) + (following - r))

    def online(self, clients: Tensor, t: float) -> Tensor:
        """``[K]`` bool: whether each client is online at ``t``."""
        return self.next_available(clients, t) == float(t)


class DeviceCapacity:
    """Each client's speed: FedScale's ``client_device_capacity`` (module docstring), read and checked once.

    Attributes:
        computation: ``[M]`` float64 milliseconds per example (a forward pass), in the sorted ids' order.
        communication: ``[M]`` float64 kilobits per second.
    """

    def __init__(self, path: str | Path, argument: str = "device_capacity") -> None:
        raw = read_trace_file(path, argument)
        self.path = str(path)
        self.ids = _sorted_ids(list(raw))
        comp, comm = [], []
        for cid in self.ids:
            label = f"{argument}: {path}: client {cid!r}"
            entry = _fields(raw[cid], label, ("computation", "communication"))
            c = _number(entry["computation"], label, "computation")
            b = _number(entry["communication"], label, "communication")
            if c < 0:
                raise ValueError(f"{label}: computation (milliseconds per example) must be >= 0, got {c:g}")
            if b <= 0:
                raise ValueError(f"{label}: communication (kilobits per second) must be > 0, got {b:g}")
            comp.append(c)
            comm.append(b)
        self.computation = torch.tensor(comp, dtype=torch.float64)
        self.communication = torch.tensor(comm, dtype=torch.float64)

    @property
    def num_clients(self) -> int:
        """``M``, the trace's clients."""
        return len(self.ids)

    def durations(self, clients: Tensor, examples: Tensor, model_bits: float, compute_factor: float) -> Tensor:
        """``[K]`` float64 seconds: ``compute_factor x examples x computation / 1000`` to train, plus the model down
        and the update up, ``2 x model_bits / 1000 / communication``."""
        m = torch.remainder(clients.detach().cpu().long(), self.num_clients)
        train = compute_factor * examples.detach().cpu().to(torch.float64) * self.computation[m] / 1000.0
        return train + 2.0 * float(model_bits) / 1000.0 / self.communication[m]
