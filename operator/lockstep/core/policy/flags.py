"""The SGLang flag table and the splitting of a user's `args` into flags with values.

One table per supported SGLang release (`sglang_flags/<version>.json`), generated from the
real `ServerArgs` parser of that release by `.ci/gen-sglang-flags`; the operator never
imports SGLang. We do not
hand the user's args to an `argparse` parser rebuilt from the table: argparse stops at
the first error (and exits), while the policy must report *every* problem with the index
of the offending arg. So this module only splits args into (flag, values) items and
checks arity, value type and choices against the table; SGLang's own argparse parses the
final argv in the pod.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Literal

Arity = Literal["switch", "one", "optional", "many", "some"]


@dataclass(frozen=True)
class FlagSpec:
    """One SGLang server flag: all its spellings, arity, value type and choices."""

    options: tuple[str, ...]
    dest: str
    arity: Arity
    type: str | None
    choices: tuple[str, ...] | None
    deprecated: str | None = None

    @property
    def name(self) -> str:
        """The canonical spelling."""
        return self.options[0]


@dataclass(frozen=True)
class FlagTable:
    """Every flag of one SGLang release, by each of its spellings."""

    sglang_version: str
    by_option: dict[str, FlagSpec]

    def lookup(self, option: str) -> FlagSpec | None:
        """The flag spelled `option`, or None."""
        return self.by_option.get(option)

    def expand_prefix(self, option: str) -> FlagSpec | None:
        """The flag argparse would take `option` for as an abbreviation (a prefix of
        exactly one flag's long spellings), or None."""
        if not option.startswith("--") or len(option) < 3:
            return None
        found = {id(s): s for name, s in self.by_option.items() if name.startswith(option)}
        return next(iter(found.values())) if len(found) == 1 else None

    def closest(self, option: str) -> str | None:
        """The known spelling closest to a misspelt `option`, if any is close."""
        found = difflib.get_close_matches(option, list(self.by_option), n=1, cutoff=0.6)
        return found[0] if found else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@cache
def supported_versions() -> tuple[str, ...]:
    """Every SGLang release with a committed flag table, oldest first."""
    tables = resources.files("lockstep.core.policy").joinpath("sglang_flags")
    names = [t.name.removesuffix(".json") for t in tables.iterdir() if t.name.endswith(".json")]
    return tuple(sorted(names, key=_version_key))


@cache
def load_flag_table(version: str | None = None) -> FlagTable:
    """The committed table of one SGLang release (default: the newest supported)."""
    version = version or supported_versions()[-1]
    if version not in supported_versions():
        raise KeyError(f"no flag table for SGLang {version}")
    path = resources.files("lockstep.core.policy").joinpath("sglang_flags", f"{version}.json")
    raw = json.loads(path.read_text())
    by_option: dict[str, FlagSpec] = {}
    for f in raw["flags"]:
        spec = FlagSpec(
            options=tuple(f["options"]),
            dest=f["dest"],
            arity=f["arity"],
            type=f["type"],
            choices=tuple(f["choices"]) if f["choices"] else None,
            deprecated=f.get("deprecated"),
        )
        for option in spec.options:
            by_option.setdefault(option, spec)
    return FlagTable(sglang_version=raw["sglang_version"], by_option=by_option)


@dataclass
class ArgItem:
    """One flag the user wrote, with its values and where it stands in `args`."""

    index: int
    option: str
    values: list[str] = field(default_factory=list)
    inline: bool = False  # written as --flag=value

    def tokens(self) -> list[str]:
        """The argv tokens for this item."""
        if self.inline:
            return [f"{self.option}={self.values[0]}"]
        return [self.option, *self.values]


@dataclass
class SplitArgs:
    """The user's args as items, plus tokens that belong to no flag."""

    items: list[ArgItem]
    stray: list[tuple[int, str]]


_NUMBER = re.compile(r"^-\d")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token) and token != "-"


def split_args(args: list[str]) -> SplitArgs:
    """Split args into flags with the values that follow them (until the next flag)."""
    items: list[ArgItem] = []
    stray: list[tuple[int, str]] = []
    current: ArgItem | None = None
    for i, token in enumerate(args):
        if _is_flag(token):
            if "=" in token and token.startswith("--"):
                option, value = token.split("=", 1)
                items.append(ArgItem(i, option, [value], inline=True))
                current = None
            else:
                current = ArgItem(i, token)
                items.append(current)
        elif current is not None:
            current.values.append(token)
        else:
            stray.append((i, token))
    return SplitArgs(items, stray)


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def check_value(spec: FlagSpec, value: str) -> str | None:
    """Why `value` is not a valid value of `spec`, or None when it is."""
    if spec.choices is not None and value not in spec.choices:
        return f"{value!r} is not one of {', '.join(spec.choices)}"
    kind = spec.type
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        elif kind == "json":
            json.loads(value)
        elif kind == "human_int":
            _human_int(value)
    except ValueError:
        expected = {
            "int": "an integer",
            "float": "a number",
            "json": "JSON",
            "human_int": "an integer (k/M/G/T or Ki/Mi/Gi/Ti suffixes allowed)",
        }[str(kind)]
        return f"{value!r} is not {expected}"
    return None


def _human_int(value: str) -> int:
    for suffix, factor in _IEC.items():
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * factor
    if value and value[-1] in _SI:
        return int(float(value[:-1]) * _SI[value[-1]])
    return int(value)
