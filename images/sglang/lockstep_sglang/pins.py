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
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SGLANG_VERSION = "0.5.23"

# module:qualname -> first 16 hex of sha256(source). Regenerate: python -m lockstep_sglang.pins
PINNED_SOURCES: dict[str, str] = {
    "sglang.srt.disaggregation.decode:DecodePreallocQueue._update_handshake_waiters": "355bf412b435b386",
    "sglang.srt.disaggregation.decode:DecodePreallocQueue.pop_preallocated": "6ba68adeb0dfe837",
    "sglang.srt.disaggregation.decode:DecodeTransferQueue.pop_transferred": "016f67c7064c1da6",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin.event_loop_normal_disagg_decode": "2ea5936a5c3c262f",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode": "7e78a9927e47eaef",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run": "8a9255e6fcf4cacb",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin.process_decode_queue": "eebd4b89bba2df2f",
    "sglang.srt.disaggregation.prefill:PrefillBootstrapQueue.pop_bootstrapped": "88a0d9b58692bb20",
    "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill": "b4315a1aa380343b",
    "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin.event_loop_overlap_disagg_prefill": "702058c506cbd795",
    "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run": "97d4e18208d60912",
    "sglang.srt.disaggregation.prefill:SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue": "41c14e7c6d8ff1e2",
    "sglang.srt.distributed.parallel_state:GroupCoordinator.__init__": "dfcd45b955026c6b",
    "sglang.srt.entrypoints.engine:Engine._launch_scheduler_processes": "b7b80a129761b6df",
    "sglang.srt.entrypoints.engine:Engine._launch_subprocesses": "a0b3d867c98c574f",
    "sglang.srt.entrypoints.engine:init_tokenizer_manager": "60ae903ef4cd093e",
    "sglang.srt.entrypoints.http_server:launch_server": "92fe88cd0c030d93",
    "sglang.srt.managers.data_parallel_controller:run_data_parallel_controller_process": "0f549bcf80d1ef80",
    "sglang.srt.managers.io_struct:hook_custom_types": "5b18bee982155391",
    "sglang.srt.managers.scheduler:Scheduler.event_loop_normal": "c328a45b821f18a0",
    "sglang.srt.managers.scheduler:Scheduler.event_loop_overlap": "c093eb14e50c1ac6",
    "sglang.srt.managers.scheduler:Scheduler.get_next_batch_to_run": "34f30fd4dfb13d74",
    "sglang.srt.managers.scheduler:Scheduler.ingest_requests": "77f9e386bae1ee18",
    "sglang.srt.managers.scheduler:Scheduler.init_rank_consensus_checker": "21d4dc8616bd3146",
    "sglang.srt.managers.scheduler:Scheduler.init_request_dispatcher": "cb92e09cf7b42a68",
    "sglang.srt.managers.scheduler:Scheduler.process_batch_result": "726305f46a979a47",
    "sglang.srt.managers.scheduler:Scheduler.process_input_requests": "b8c3ef031ea741a8",
    "sglang.srt.managers.scheduler:Scheduler.run_batch": "4e9bb4d5e649e2f1",
    "sglang.srt.managers.scheduler:_dispatch_event_loop_once": "6bc1b9a8ccf641ee",
    "sglang.srt.managers.scheduler:run_scheduler_process": "f52f0de806e29a75",
    "sglang.srt.managers.scheduler_components.output_sender:SenderWrapper.send_output": "1d5813445567e875",
    "sglang.srt.managers.scheduler_components.request_receiver:SchedulerRequestReceiver._pull_raw_reqs": "0af9fb996bb0049a",
    "sglang.srt.managers.scheduler_components.request_receiver:SchedulerRequestReceiver.recv_requests": "2b9c24e4a31976b0",
    "sglang.srt.managers.tokenizer_manager:TokenizerManager._dispatch_to_scheduler": "ed9f20c2b6f0ea70",
    "sglang.srt.managers.tokenizer_manager:TokenizerManager.handle_loop": "6fa0284273554cd6",
    "sglang.srt.utils.common:broadcast_pyobj": "ed29d8e429b555e8",
    "sglang.srt.utils.common:point_to_point_pyobj": "f2d5b324c842dc63",
    "sglang.srt.utils.rank_consensus_checker:_check_for_consensus": "8605e07eb7f9d004",
    "sglang.srt.utils.rank_consensus_checker:_create_sync_groups": "49587fe121295345",
    "sglang.srt.utils.rank_consensus_checker:_worker_loop": "ac6aaa82553aadfc",
    "sglang.srt.utils.rank_consensus_checker:assert_same": "e3da247aceca9aa5",
    "sglang.srt.utils.rank_consensus_checker:configure": "ad92e1e392ec6b0c",
    "sglang.srt.utils.rank_consensus_checker:enabled": "2ad6a39e8e7dc1b5",
}


@dataclass(frozen=True)
class SeedFix:
    """An upstream fix that must stay present."""

    target: str
    snippet: str
    why: str


SEED_FIXES: tuple[SeedFix, ...] = (
    SeedFix(
        "sglang.srt.managers.scheduler:Scheduler.handle_rpc_request",
        "barrier(group=self.tp_group.cpu_group)",
        "RPC barrier scoped to the TP CPU group; a world barrier deadlocks DP/PP layouts",
    ),
    SeedFix(
        "sglang.srt.managers.scheduler_components.request_receiver:"
        "SchedulerRequestReceiver._finalize_shm_features",
        "barrier(group=parallel.tp_group.cpu_group)",
        "every TP rank opens the multimodal shm segments before any rank unlinks them",
    ),
    SeedFix(
        "sglang.srt.managers.scheduler_components.request_receiver:"
        "SchedulerRequestReceiver._finalize_shm_features",
        "all_reduce(failed, op=ReduceOp.MAX, group=parallel.tp_group.cpu_group)",
        "every TP rank rejects the same failed multimodal requests before model collectives",
    ),
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

        lines = [
            f"lockstep-sglang {__version__} refuses to start: it was written against "
            f"SGLang {SGLANG_VERSION}, installed is SGLang {self.installed_version or 'none'}."
        ]
        lines += [f"  - {p}" for p in self.problems]
        lines.append(
            "Use the image's pinned SGLang, or re-validate the hooks against the new source "
            "and regenerate the pins (python -m lockstep_sglang.pins)."
        )
        return "\n".join(lines)


def check(
    pinned: Mapping[str, str] | None = None,
    *,
    expected_version: str = SGLANG_VERSION,
    installed_version: str | None = None,
) -> PinReport:
    """Compare the installed SGLang with ``expected_version`` and the pinned sources."""
    version = installed_version if installed_version is not None else installed_sglang_version()
    report = PinReport(installed_version=version)
    if version != expected_version:
        report.problems.append(f"SGLang version is {version or 'missing'}, not {expected_version}")
        return report
    for target, want in sorted((PINNED_SOURCES if pinned is None else pinned).items()):
        try:
            got = digest(source_of(target))
        except Exception as exc:
            report.problems.append(f"{target}: cannot read its source ({exc})")
            continue
        if got != want:
            report.problems.append(
                f"{target} changed: source sha256 {got} != {want} pinned for SGLang "
                f"{expected_version}"
            )
    return report


def missing_seed_fixes(fixes: Sequence[SeedFix] = SEED_FIXES) -> list[str]:
    """The seed fixes not found in the installed source (empty: all present)."""
    missing: list[str] = []
    for fix in fixes:
        if fix.snippet not in source_of(fix.target):
            missing.append(f"{fix.target}: lost {fix.snippet!r} ({fix.why})")
    return missing


def regenerate(targets: Sequence[str]) -> dict[str, str]:
    """Digests of ``targets`` in the installed SGLang."""
    return {target: digest(source_of(target)) for target in targets}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the pin table of the installed SGLang, or ``--check`` it."""
    parser = argparse.ArgumentParser(prog="python -m lockstep_sglang.pins")
    parser.add_argument("--check", action="store_true", help="exit 1 when a pin mismatches")
    args = parser.parse_args(argv)
    if args.check:
        report = check()
        missing = missing_seed_fixes() if report.ok else []
        if report.ok and not missing:
            print(f"SGLang {report.installed_version}: {len(PINNED_SOURCES)} pins match")
            return 0
        print(report.message() if not report.ok else "\n".join(missing), file=sys.stderr)
        return 1
    print("PINNED_SOURCES: dict[str, str] = {")
    for target, value in regenerate(sorted(PINNED_SOURCES)).items():
        print(f'    "{target}": "{value}",')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
