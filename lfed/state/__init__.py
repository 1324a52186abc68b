"""State: the components' declared state and its store (:mod:`~lfed.state.spec`), where per-client rows live
(:mod:`~lfed.state.stores`), run fingerprints (:mod:`~lfed.state.fingerprint`) and atomic writes
(:mod:`~lfed.state.atomic`). The names of 0.4's ``lfed.state`` are exported here (imported on first use)."""

from lfed import _lazy_exports

#: 0.4's ``lfed.state`` names, from their module now (imported on first use).
_LAZY = {
    "GLOBAL": "lfed.state.spec",
    "read_only_rows": "lfed.state.spec",
    "reading_read_only": "lfed.state.spec",
    "masked_rows": "lfed.state.spec",
    "client_range": "lfed.state.spec",
    "StateSpec": "lfed.state.spec",
    "check_state_shapes": "lfed.state.spec",
    "state_shape_errors": "lfed.state.spec",
    "state_shape_error": "lfed.state.spec",
    "StateStore": "lfed.state.spec",
    "ModuleStateStore": "lfed.state.spec",
}

__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
