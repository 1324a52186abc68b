"""Rewrite lfed 0.3 configs to the grouped settings of 0.4, and 0.4's class paths to where the classes are now, in
place, comments kept (issues 41 and 64).

    python scripts/upgrade_configs.py FILE.yaml [...]          # rewrite, print what changed
    python scripts/upgrade_configs.py --check FILE.yaml [...]  # exit 1 if any file still has a 0.3 key or 0.4 path

The ``model:`` block's flat keys move into their groups (``client_lr`` -> ``training: {client_lr}``), the
renamed roles get their new word (``aggregation`` -> ``combination``, ``compression`` -> ``channel``), a method
setting becomes its component's (``mu: 0.1`` -> ``objective: {class_path: ...Prox, init_args: {mu: 0.1}}``),
and ``model.<key>`` in grid axes and ``--model.<key>`` in overrides get the new path. A module path that moved
(``lfed.asynchronous.FedBuff`` -> ``lfed.core.asynchronous.FedBuff``; :data:`lfed.REMOVED`, :data:`lfed.MOVED`) gets
its new one. Each rewritten file is checked: its ``model:`` section must equal :func:`lfed.core.settings.upgrade` of
the old one, its class paths as :func:`lfed.current_path` spells them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from lfed import current_path
from lfed.core.settings import GROUPED, METHOD, RENAMED, upgrade
from lfed.state.fingerprint import current_class_paths

KEY = re.compile(r"^  ([A-Za-z_]\w*):(.*)$")
#: A dotted lfed path anywhere in a file (a class_path, a comment).
LFED_PATH = re.compile(r"(?<![\w.])lfed(?:\.\w+)+")


def _split_comment(rest: str) -> tuple[str, str]:
    value, hash_, comment = rest.partition(" #")
    return value.strip(), ("#" + comment).strip() if hash_ else ""


def upgrade_text(text: str) -> tuple[str, list[str]]:
    lines = text.splitlines()
    moved = [f"{p} is {current_path(p)} now" for p in dict.fromkeys(LFED_PATH.findall(text)) if current_path(p) != p]
    try:
        start = lines.index("model:")
    except ValueError:
        return _paths(text), moved
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((" ", "#"))), len(lines))
    block = lines[start + 1:end]
    old_model = (yaml.safe_load(text) or {}).get("model") or {}
    new_model, messages = upgrade(old_model)
    new_model, messages = current_class_paths(new_model), messages + moved
    out: list[str] = []
    groups: dict[str, list[str]] = {}
    group_at: dict[str, int] = {}
    i = 0
    while i < len(block):
        line = block[i]
        m = KEY.match(line)
        if not m:
            out.append(line)
            i += 1
            continue
        key, rest = m.group(1), m.group(2)
        value, comment = _split_comment(rest)
        if key in GROUPED:
            group = GROUPED[key]
            if group not in group_at:
                group_at[group] = len(out)
                out.append(f"__GROUP__{group}")
            groups.setdefault(group, []).append(f"    {key}: {value}" + (f"  {comment}" if comment else ""))
        elif key in RENAMED:
            out.append(f"  {RENAMED[key]}:{rest}")
        elif key in METHOD:
            role = METHOD[key][0]
            if role not in group_at:
                group_at[role] = len(out)
                out.append(f"__GROUP__{role}")
            if comment:
                out.insert(group_at[role], f"  # {METHOD[key][3]}: {comment.lstrip('# ')}")
                group_at = {g: (p + 1 if p >= group_at[role] else p) for g, p in group_at.items()}
        elif key in ("objective", "combination", "sampler") and key in group_at:
            pass  # rewritten with its method setting (below)
        else:
            out.append(line)
        i += 1
    rendered: list[str] = []
    for line in out:
        if line.startswith("__GROUP__"):
            name = line[len("__GROUP__"):]
            if name in groups:
                rendered += [f"  {name}:", *groups[name]]
            elif name in new_model and isinstance(new_model[name], dict):
                comp = new_model[name]
                args = yaml.safe_dump(comp.get("init_args") or {}, default_flow_style=True, width=200, sort_keys=False).strip()
                rendered += [f"  {name}:", f"    class_path: {comp['class_path']}", f"    init_args: {args}"]
        else:
            rendered.append(line)
    # a role named on its own line after its method setting: drop that line (it is in the component now)
    for role in ("objective", "combination", "sampler"):
        if role in group_at and isinstance(new_model.get(role), dict):
            rendered = [ln for ln in rendered if not re.match(rf"^  {role}: \w+\s*(#.*)?$", ln)]
    new_text = "\n".join(lines[:start + 1] + rendered + lines[end:]) + ("\n" if text.endswith("\n") else "")
    new_text = _paths(new_text)
    got = (yaml.safe_load(new_text) or {}).get("model") or {}
    if got != new_model:
        raise SystemExit(f"the rewrite differs from lfed.core.settings.upgrade:\n{got}\n!=\n{new_model}")
    return new_text, messages


def _paths(text: str) -> str:
    """``model.<key>`` (grid axes, overrides, comments) and module paths that moved with the new path."""
    text = LFED_PATH.sub(lambda m: current_path(m.group(0)), text)
    for key, group in GROUPED.items():
        text = re.sub(rf"(?<![\w.])model\.{key}\b", f"model.{group}.{key}", text)
    for old, new in RENAMED.items():
        text = re.sub(rf"(?<![\w.])model\.{old}\b", f"model.{new}", text)
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    stale = 0
    for f in args.files:
        path = Path(f)
        text = path.read_text()
        new, messages = upgrade_text(text)
        if new != text:
            stale += 1
            if args.check:
                print(f"{f}: 0.3 keys or 0.4 paths ({'; '.join(messages) or 'model.<key> paths'})")
            else:
                path.write_text(new)
                print(f"{f}: {len(messages)} keys and paths rewritten")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
