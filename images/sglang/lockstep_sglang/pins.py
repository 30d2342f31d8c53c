"""The SGLang release and sources lockstep's hooks were written against.

The launcher refuses to start when the installed SGLang is another version, or when any
function listed here — the ones hooked, and the loops whose shape the hooks rely on (a
decision is made by ``get_next_*_batch_to_run`` before the collectives it gates) — has
different source. A mismatch names the function and both versions; after re-reading the
new source, regenerate the table with ``python -m lockstep_sglang.pins``.

``SEED_FIXES`` are fixes this project's seeds proposed and SGLang merged upstream before
0.5.23; a version bump that loses one must fail loudly (a test checks them).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"  # the newest supported release (images, the real-SGLang tier)

# One file per supported SGLang release: sglang_pins/<version>.json,
# {"sglang_version", "sources": {module:qualname: first 16 hex of sha256(source)},
#  "seed_fixes": [{"target", "snippet", "why"}]}. Regenerate for the installed SGLang:
# python -m lockstep_sglang.pins --write
PINS_DIR = Path(__file__).resolve().parent / "sglang_pins"


@dataclass(frozen=True)
class SeedFix:
    """An upstream fix that must stay present."""

    target: str
    snippet: str
    why: str


@dataclass(frozen=True)
class VersionPins:
    """What lockstep checks of one SGLang release before it hooks it."""

    sglang_version: str
    sources: dict[str, str]
    seed_fixes: tuple[SeedFix, ...] = ()

    @classmethod
    def load(cls, path: Path) -> VersionPins:
        raw = json.loads(path.read_text())
        fixes = tuple(SeedFix(f["target"], f["snippet"], f["why"]) for f in raw["seed_fixes"])
        return cls(raw["sglang_version"], dict(raw["sources"]), fixes)

    def dump(self) -> str:
        return (
            json.dumps(
                {
                    "sglang_version": self.sglang_version,
                    "sources": dict(sorted(self.sources.items())),
                    "seed_fixes": [
                        {"target": f.target, "snippet": f.snippet, "why": f.why}
                        for f in self.seed_fixes
                    ],
                },
                indent=1,
            )
            + "\n"
        )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


SUPPORTED: dict[str, VersionPins] = {
    pins.sglang_version: pins
    for pins in sorted(
        (VersionPins.load(path) for path in PINS_DIR.glob("*.json")),
        key=lambda v: _version_key(v.sglang_version),
    )
}
"""Every supported SGLang release, oldest first."""
SUPPORTED_VERSIONS: tuple[str, ...] = tuple(SUPPORTED)
PINNED_SOURCES: dict[str, str] = SUPPORTED[SGLANG_VERSION].sources
"""The newest release's pins (every release pins the same functions)."""
SEED_FIXES: tuple[SeedFix, ...] = SUPPORTED[SGLANG_VERSION].seed_fixes
HOW_TO_ADD = (
    "to support another release, run .ci/sglang-release <version> and review what it "
    "reports (docs/validation.md: Supporting a new SGLang release)"
)


def resolve(target: str) -> Any:
    """Import ``module:qualname`` and return the (unwrapped) function it names."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        owner = obj
        obj = (
            inspect.getattr_static(owner, part) if inspect.isclass(owner) else getattr(owner, part)
        )
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return inspect.unwrap(obj)


def source_of(target: str) -> str:
    """The source text of ``target``."""
    return inspect.getsource(resolve(target))


def digest(source: str) -> str:
    """First 16 hex digits of the source's SHA-256."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def installed_sglang_version() -> str | None:
    """The installed SGLang version, or None when SGLang is missing."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - stdlib
        return None
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


@dataclass
class PinReport:
    """Result of checking the installed SGLang against the pins."""

    installed_version: str | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.problems

    def message(self) -> str:
        """What an operator reads when the launcher refuses to start."""
        from lockstep_sglang import __version__

        supported = ", ".join(SUPPORTED_VERSIONS)
        lines = [
            f"lockstep-sglang {__version__} refuses to start on SGLang "
            f"{self.installed_version or 'none'} (supported: {supported})."
        ]
        lines += [f"  - {p}" for p in self.problems]
        lines.append(
            "Use an image of a supported SGLang release (and set spec.sglangVersion to it); "
            + HOW_TO_ADD
            + "."
        )
        return "\n".join(lines)


def check(
    pinned: Mapping[str, str] | None = None,
    *,
    expected_version: str | None = None,
    installed_version: str | None = None,
) -> PinReport:
    """Compare the installed SGLang with the pins of its own release (or of
    ``expected_version``: the release the deployment declares)."""
    version = installed_version if installed_version is not None else installed_sglang_version()
    report = PinReport(installed_version=version)
    if expected_version is not None and version != expected_version:
        report.problems.append(
            f"the deployment declares SGLang {expected_version} (spec.sglangVersion), the "
            f"image runs {version or 'no SGLang'}: fix spec.sglangVersion or spec.image"
        )
        return report
    if pinned is None:
        if version not in SUPPORTED:
            report.problems.append(f"SGLang {version or 'missing'} is not a supported release")
            return report
        pinned = SUPPORTED[version].sources
    for target, want in sorted(pinned.items()):
        try:
            got = digest(source_of(target))
        except Exception as exc:
            report.problems.append(f"{target}: cannot read its source ({exc})")
            continue
        if got != want:
            report.problems.append(
                f"{target} changed: source sha256 {got} != {want} pinned for SGLang {version}"
            )
    return report


def missing_seed_fixes(fixes: Sequence[SeedFix] | None = None) -> list[str]:
    """The seed fixes of the installed release not found in its source (empty: all
    present)."""
    if fixes is None:
        version = installed_sglang_version()
        fixes = SUPPORTED[version].seed_fixes if version in SUPPORTED else SEED_FIXES
    missing: list[str] = []
    for fix in fixes:
        if fix.snippet not in source_of(fix.target):
            missing.append(f"{fix.target}: lost {fix.snippet!r} ({fix.why})")
    return missing


def regenerate(targets: Sequence[str]) -> dict[str, str]:
    """Digests of ``targets`` in the installed SGLang."""
    return {target: digest(source_of(target)) for target in targets}


def main(argv: Sequence[str] | None = None) -> int:
    """``--check`` the installed SGLang against its release's pins, or ``--write`` the
    pins of the installed release (the newest release's targets and seed fixes, whose
    snippets must then be checked by hand)."""
    parser = argparse.ArgumentParser(prog="python -m lockstep_sglang.pins")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="exit 1 when a pin mismatches")
    action.add_argument(
        "--write", action="store_true", help="write sglang_pins/<installed version>.json"
    )
    args = parser.parse_args(argv)
    version = installed_sglang_version()
    if args.check:
        report = check()
        missing = missing_seed_fixes() if report.ok else []
        if report.ok and not missing:
            print(f"SGLang {version}: {len(SUPPORTED[str(version)].sources)} pins match")
            return 0
        print(report.message() if not report.ok else "\n".join(missing), file=sys.stderr)
        return 1
    if version is None:
        print("no SGLang installed", file=sys.stderr)
        return 1
    known = SUPPORTED.get(version)
    pins = VersionPins(
        version,
        regenerate(sorted(PINNED_SOURCES)),
        known.seed_fixes if known is not None else SEED_FIXES,
    )
    path = PINS_DIR / f"{version}.json"
    path.write_text(pins.dump())
    print(f"wrote {path} ({len(pins.sources)} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
