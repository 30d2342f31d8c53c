"""Rank state: a per-rank flight recorder in shared memory, and its JSON form.

Every TP rank publishes, into one small memory-mapped file of its own, what it is doing
right now: its loop iteration, the last scheduling decision it made, and the collective
it is blocked in (if any). The pod agent (another process) reads those files and serves
them as JSON to the operator, whose verdict logic compares ranks: ranks in different
collectives or at different decision sequences are *desynced*; ranks in the same
collective with no progress are *hung*.

Why shared memory and not a socket or a log: the writer sits on the scheduler's hot
path (once per collective), so publishing must cost a few memory stores — no lock, no
syscall (``time.time`` is served by the vDSO) — and must stay readable after the rank
wedges or dies. A seqlock (a generation counter made odd while a write is in progress)
lets the reader detect and retry a torn read without the writer ever waiting.

Files live in ``state_dir`` (``LOCKSTEP_STATE_DIR``, default ``/dev/shm/lockstep``):
``rank-<rank>.state`` (binary, fixed layout below) and, after a consensus failure,
``rank-<rank>.failure.json`` (written once, on the failure path, where syscalls are fine).

JSON schema (``SCHEMA`` = ``"lockstep.dev/rank-state/v1"``), one object per rank::

    {
      "rank": int,               # global torch.distributed rank
      "tp_rank": int,            # rank inside its TP group
      "pid": int,                # the scheduler process
      "alive": bool,             # the reader's check that pid still exists
      "process": str | null,     # its OS state from /proc/<pid>/stat: running, sleeping,
                                 # uninterruptible, stopped, traced, zombie, dead, idle,
                                 # gone (no such process); null where /proc cannot tell
      "started_at": float,       # unix seconds, when the writer was created
      "updated_at": float,       # unix seconds, last write of any field
      "iteration": int,          # scheduler loop iterations started
      "last_decision": null | {
        "kind": "batch" | "idle",
        "forward_mode": str | null,   # SGLang ForwardMode name, null when idle
        "batch_size": int,
        "rids_hash": str,             # order-insensitive hash of the batch's request ids
        "seq": int                    # 1-based count of decisions this rank made
      },
      "step": {                  # the rank's model steps (run_batch): the operator tells a
        "since": float | null,   # long legitimate step from a hang by them
        "count": int,            # steps finished
        "recent_s": [float, ...] # durations of the last 8, newest last
      },
      "collective": null | {     # the outermost collective this rank is inside now
        "op": str,               # e.g. "broadcast_pyobj", "all_reduce", "run_batch"
        "group": str,            # process group description, e.g. "tp:cpu", "tp:device"
        "seq": int,              # 1-based count of collectives this rank entered on group
        "since": float           # unix seconds when it entered
      },
      "consensus": null | {      # the decision consensus of this rank is live:
        "checks": int,           # comparisons across ranks that passed
        "events_checked": int,   # events compared (SGLang's own and lockstep's)
        "decisions_checked": int,  # of those, lockstep's decision/queue events
        "updated_at": float      # written by the checker's thread, at most once a second
      },
      "consensus_failure": null | {   # see consensus.DivergenceReport.to_json
        "detected_at": float, "rank": int, "events_checked": int, "local_hash": str,
        "first_divergence": null | {"index": int, "events": {"<rank>": str | null}},
        "recent_events": {"<rank>": [str, ...]}
      }
    }

In ``consensus_failure``, ``index`` counts within the events compared in the failing
check (the checker compares in batches); ``last_decision.seq`` places it in the run.
Event texts are those of :mod:`lockstep_sglang.consensus` (``lockstep decision batch
mode=DECODE size=8 rids=…``, ``lockstep decode.transfer poll n=3``, ...).

``op`` values ``run_batch`` and ``process_batch_result`` on group ``<tp>:device`` mark
the host waiting on device work that contains the model's collectives (NCCL kernels are
asynchronous, so the host blocks in these calls, not in the collective's launch).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

SCHEMA = "lockstep.dev/rank-state/v1"
STATE_DIR_ENV = "LOCKSTEP_STATE_DIR"
DEFAULT_STATE_DIR = "/dev/shm/lockstep"
PREVIOUS_SUBDIR = "previous"

_MAGIC = b"LCKSTP02"  # 02: the step fields
RECENT_STEPS = 8
_NAME_BYTES = 48
_SHORT_BYTES = 24
_KIND_NONE, _KIND_IDLE, _KIND_BATCH = 0, 1, 2
_KIND_NAMES: dict[int, Literal["batch", "idle"]] = {_KIND_IDLE: "idle", _KIND_BATCH: "batch"}


class DecisionJSON(TypedDict):
    """The last scheduling decision of a rank."""

    kind: Literal["batch", "idle"]
    forward_mode: str | None
    batch_size: int
    rids_hash: str
    seq: int


class StepJSON(TypedDict):
    """The rank's model steps (`run_batch`): how long they take, and the one running."""

    since: float | None  # unix seconds the running step started; None: not in a step
    count: int  # steps finished since the rank started
    recent_s: list[float]  # durations of the last steps, newest last (at most 8)


class CollectiveJSON(TypedDict):
    """The collective a rank is inside now."""

    op: str
    group: str
    seq: int
    since: float


class DivergenceJSON(TypedDict):
    """Where the per-rank event sequences first differ."""

    index: int
    events: dict[str, str | None]


class ConsensusFailureJSON(TypedDict):
    """Evidence a rank wrote when the decision consensus found a divergence."""

    detected_at: float
    rank: int
    events_checked: int
    local_hash: str
    first_divergence: DivergenceJSON | None
    recent_events: dict[str, list[str]]


class ConsensusStatsJSON(TypedDict):
    """What the decision consensus of one rank has compared so far."""

    checks: int
    events_checked: int
    decisions_checked: int
    updated_at: float


class RankStateJSON(TypedDict):
    """One rank's published state (see the module docstring)."""

    rank: int
    tp_rank: int
    pid: int
    alive: bool
    process: str | None
    started_at: float
    updated_at: float
    iteration: int
    last_decision: DecisionJSON | None
    collective: CollectiveJSON | None
    step: StepJSON
    consensus: ConsensusStatsJSON | None
    consensus_failure: ConsensusFailureJSON | None
    error: NotRequired[str]


class _Layout(ctypes.Structure):
    """The binary layout of a ``rank-<rank>.state`` file (native endianness)."""

    _fields_ = (
        ("magic", ctypes.c_char * 8),
        ("generation", ctypes.c_uint64),
        ("rank", ctypes.c_int32),
        ("tp_rank", ctypes.c_int32),
        ("pid", ctypes.c_int32),
        ("decision_kind", ctypes.c_uint8),
        ("collective_active", ctypes.c_uint8),
        ("started_at", ctypes.c_double),
        ("updated_at", ctypes.c_double),
        ("iteration", ctypes.c_uint64),
        ("decision_seq", ctypes.c_uint64),
        ("decision_batch_size", ctypes.c_uint64),
        ("decision_forward_mode", ctypes.c_char * _SHORT_BYTES),
        ("decision_rids_hash", ctypes.c_char * _SHORT_BYTES),
        ("collective_seq", ctypes.c_uint64),
        ("collective_since", ctypes.c_double),
        ("collective_op", ctypes.c_char * _NAME_BYTES),
        ("collective_group", ctypes.c_char * _NAME_BYTES),
        ("step_since", ctypes.c_double),
        ("step_count", ctypes.c_uint64),
        ("step_recent", ctypes.c_double * RECENT_STEPS),
    )
    # Typed views of the fields above, for mypy (ctypes ignores annotations).
    magic: bytes
    generation: int
    rank: int
    tp_rank: int
    pid: int
    decision_kind: int
    collective_active: int
    started_at: float
    updated_at: float
    iteration: int
    decision_seq: int
    decision_batch_size: int
    decision_forward_mode: bytes
    decision_rids_hash: bytes
    collective_seq: int
    collective_since: float
    collective_op: bytes
    collective_group: bytes
    step_since: float
    step_count: int
    step_recent: Any


_SIZE = ctypes.sizeof(_Layout)
_GENERATION_OFFSET = _Layout.generation.offset  # type: ignore[attr-defined]
_GENERATION = struct.Struct("=Q")


def state_dir_from_env(environ: dict[str, str] | None = None) -> Path:
    """The directory rank-state files live in (``LOCKSTEP_STATE_DIR``)."""
    env = os.environ if environ is None else environ
    return Path(env.get(STATE_DIR_ENV, DEFAULT_STATE_DIR))


def state_path(state_dir: Path, rank: int) -> Path:
    """Path of the binary state file of a global rank."""
    return state_dir / f"rank-{rank}.state"


def failure_path(state_dir: Path, rank: int) -> Path:
    """Path of the consensus-failure evidence of a global rank."""
    return state_dir / f"rank-{rank}.failure.json"


def consensus_path(state_dir: Path, rank: int) -> Path:
    """Path of the consensus statistics of a global rank."""
    return state_dir / f"rank-{rank}.consensus.json"


def _fit(value: str, size: int) -> bytes:
    # c_char arrays refuse longer values; a truncated name still identifies the group.
    return value.encode("utf-8", "replace")[: size - 1]


class RankStateWriter:
    """Publishes one rank's state; single writer, called from the scheduler thread.

    Collectives nest (``broadcast_pyobj`` issues two ``broadcast`` calls): the state
    shows the outermost one, and an ``opaque`` collective hides those inside it, so
    the operator sees the call SGLang made, not its parts. A non-opaque region such
    as ``run_batch`` lets an inner collective show while it runs, then reappears.
    """

    def __init__(self, path: Path, *, rank: int, tp_rank: int, pid: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A fresh file every start: a restarted rank must not inherit old counters.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, _SIZE)
            self._mmap = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path
        self.rank = rank
        self._state = _Layout.from_buffer(self._mmap)
        now = time.time()
        s = self._state
        s.magic = _MAGIC
        s.rank = rank
        s.tp_rank = tp_rank
        s.pid = os.getpid() if pid is None else pid
        s.started_at = now
        s.updated_at = now
        # (op, group, opaque) of the collectives the rank is inside, outermost first.
        self._stack: list[tuple[bytes, bytes, bool, int, float]] = []
        self._group_seq: dict[bytes, int] = {}

    @classmethod
    def create(cls, state_dir: Path, *, rank: int, tp_rank: int) -> RankStateWriter:
        """Create (or reset) the state file of ``rank`` in ``state_dir``."""
        return cls(state_path(state_dir, rank), rank=rank, tp_rank=tp_rank)

    @property
    def iteration(self) -> int:
        """Loop iterations started so far."""
        return int(self._state.iteration)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_Layout]:
        s = self._state
        s.generation += 1  # odd: a write is in progress
        try:
            yield s
        finally:
            s.updated_at = time.time()
            s.generation += 1

    def begin_iteration(self) -> None:
        """Count one scheduler loop iteration."""
        s = self._state
        s.generation += 1
        s.iteration += 1
        s.updated_at = time.time()
        s.generation += 1

    def record_decision(
        self,
        *,
        kind: Literal["batch", "idle"],
        forward_mode: str | None,
        batch_size: int,
        rids_hash: str,
        seq: int,
    ) -> None:
        """Publish the decision the rank just made."""
        with self._writing() as s:
            s.decision_kind = _KIND_BATCH if kind == "batch" else _KIND_IDLE
            s.decision_forward_mode = _fit(forward_mode or "", _SHORT_BYTES)
            s.decision_batch_size = batch_size
            s.decision_rids_hash = _fit(rids_hash, _SHORT_BYTES)
            s.decision_seq = seq

    def begin_step(self) -> float:
        """Mark the start of a model step (``run_batch``); returns its start time."""
        now = time.time()
        s = self._state
        s.generation += 1
        s.step_since = now
        s.updated_at = now
        s.generation += 1
        return now

    def end_step(self, started: float) -> None:
        """Mark the end of the step begun at ``started``: its duration joins the recent
        ones (a ring of :data:`RECENT_STEPS`)."""
        now = time.time()
        s = self._state
        s.generation += 1
        s.step_recent[s.step_count % RECENT_STEPS] = max(0.0, now - started)
        s.step_count += 1
        s.step_since = 0.0
        s.updated_at = now
        s.generation += 1

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """A model step, timed (see :meth:`begin_step`)."""
        started = self.begin_step()
        try:
            yield
        finally:
            self.end_step(started)

    def enter_collective(self, op: bytes, group: bytes, *, opaque: bool = False) -> None:
        """Mark the rank as inside collective ``op`` on ``group`` (bytes: pre-encoded)."""
        stack = self._stack
        if stack and stack[-1][2]:
            # Inside an opaque collective: its parts are not shown.
            stack.append((b"", b"", True, 0, 0.0))
            return
        seq = self._group_seq.get(group, 0) + 1
        self._group_seq[group] = seq
        since = time.time()
        stack.append((op, group, opaque, seq, since))
        self._show(op, group, seq, since)

    def exit_collective(self) -> None:
        """Mark the innermost collective entered as finished."""
        stack = self._stack
        if not stack:
            return
        op, _, _, _, _ = stack.pop()
        if not op:
            return  # a hidden part of an opaque collective
        if stack:
            outer = stack[-1]
            self._show(outer[0], outer[1], outer[3], outer[4])
        else:
            s = self._state
            s.generation += 1
            s.collective_active = 0
            s.updated_at = time.time()
            s.generation += 1

    def _show(self, op: bytes, group: bytes, seq: int, since: float) -> None:
        s = self._state
        s.generation += 1
        s.collective_op = op[: _NAME_BYTES - 1]
        s.collective_group = group[: _NAME_BYTES - 1]
        s.collective_seq = seq
        s.collective_since = since
        s.collective_active = 1
        s.updated_at = since
        s.generation += 1

    def record_failure(self, evidence: ConsensusFailureJSON) -> Path:
        """Write consensus-failure evidence next to the state file (atomic rename)."""
        target = failure_path(self.path.parent, self.rank)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(evidence, indent=1, sort_keys=True))
        os.replace(tmp, target)
        return target

    def record_consensus(self, stats: ConsensusStatsJSON) -> None:
        """Publish the consensus statistics (the checker's thread; atomic rename)."""
        target = consensus_path(self.path.parent, self.rank)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(stats))
        os.replace(tmp, target)

    def close(self) -> None:
        """Release the mapping (the file stays for the agent to read)."""
        del self._state
        self._mmap.close()


# The state letter of /proc/<pid>/stat (proc(5)), named.
_PROCESS_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible",
    "T": "stopped",
    "t": "traced",
    "Z": "zombie",
    "X": "dead",
    "x": "dead",
    "I": "idle",
    "W": "paging",
    "P": "parked",
    "K": "wakekill",
}


def process_state(pid: int) -> str | None:
    """The OS state of process `pid` (see ``_PROCESS_STATES``): "gone" when there is no
    such process, None when /proc cannot say (no /proc, not readable, an unknown letter).
    A stopped rank (SIGSTOP, a debugger) looks alive to ``kill(0)`` and waits wherever it
    stopped, inside a collective or not: this is how the operator tells it from a hang."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None
    # The command name (in parentheses) may itself hold ") ": the state follows the last.
    _, _, rest = stat.rpartition(b") ")
    return _PROCESS_STATES.get(rest[:1].decode("ascii", "replace")) if rest else None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    # A zombie (exited, not yet reaped by its parent) still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


def _step(snap: _Layout) -> StepJSON:
    count = int(snap.step_count)
    kept = min(count, RECENT_STEPS)
    ring = list(snap.step_recent)
    recent = [ring[(count - kept + i) % RECENT_STEPS] for i in range(kept)]
    return {
        "since": float(snap.step_since) or None,
        "count": count,
        "recent_s": [round(float(d), 6) for d in recent],
    }


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _snapshot(buf: mmap.mmap, retries: int = 1000) -> tuple[_Layout, bool]:
    """A consistent copy of the live record, or the last copy with ``False``.

    The window between the two generation reads is kept to one C-level slice copy, so
    a writer busy in a tight loop still leaves gaps wide enough to read.
    """
    raw = buf[:_SIZE]
    for attempt in range(retries):
        (g1,) = _GENERATION.unpack_from(buf, _GENERATION_OFFSET)
        raw = buf[:_SIZE]
        (g2,) = _GENERATION.unpack_from(buf, _GENERATION_OFFSET)
        if g1 == g2 and not g1 % 2:
            return _Layout.from_buffer_copy(raw), True
        if attempt % 64 == 63:
            time.sleep(0)  # let a descheduled writer finish its block
    return _Layout.from_buffer_copy(raw), False


def read_failure(state_dir: Path, rank: int) -> ConsensusFailureJSON | None:
    """The consensus-failure evidence of ``rank``, if it wrote any."""
    path = failure_path(state_dir, rank)
    try:
        data: ConsensusFailureJSON = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def read_consensus(state_dir: Path, rank: int) -> ConsensusStatsJSON | None:
    """The consensus statistics of ``rank``, if its checker published any."""
    try:
        data: ConsensusStatsJSON = json.loads(consensus_path(state_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    return data


def read_rank_state(path: Path) -> RankStateJSON:
    """Read one ``rank-<rank>.state`` file into its JSON form (see module docstring)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < _SIZE:
            raise ValueError(f"{path}: not a lockstep rank-state file")
        # Read through a shared mapping: the seqlock check needs the live generation
        # before and after the copy, which a plain read() cannot give.
        with mmap.mmap(f.fileno(), _SIZE, prot=mmap.PROT_READ) as mm:
            if mm[:8] != _MAGIC:
                raise ValueError(f"{path}: not a lockstep rank-state file")
            snap, consistent = _snapshot(mm)
    decision: DecisionJSON | None = None
    if snap.decision_kind in _KIND_NAMES:
        kind = _KIND_NAMES[snap.decision_kind]
        decision = {
            "kind": kind,
            "forward_mode": _decode(snap.decision_forward_mode) or None,
            "batch_size": int(snap.decision_batch_size),
            "rids_hash": _decode(snap.decision_rids_hash),
            "seq": int(snap.decision_seq),
        }
    collective: CollectiveJSON | None = None
    if snap.collective_active:
        collective = {
            "op": _decode(snap.collective_op),
            "group": _decode(snap.collective_group),
            "seq": int(snap.collective_seq),
            "since": float(snap.collective_since),
        }
    state: RankStateJSON = {
        "rank": int(snap.rank),
        "tp_rank": int(snap.tp_rank),
        "pid": int(snap.pid),
        "alive": _pid_alive(int(snap.pid)),
        "process": process_state(int(snap.pid)),
        "started_at": float(snap.started_at),
        "updated_at": float(snap.updated_at),
        "iteration": int(snap.iteration),
        "last_decision": decision,
        "collective": collective,
        "step": _step(snap),
        "consensus": read_consensus(path.parent, int(snap.rank)),
        "consensus_failure": read_failure(path.parent, int(snap.rank)),
    }
    if not consistent:
        # Still served: a rank missing from the answer would read as a dead rank.
        state["error"] = "the rank kept writing while being read; fields may mix two writes"
    return state


def read_rank_states(state_dir: Path) -> list[RankStateJSON]:
    """Every rank's state in ``state_dir``, ordered by rank; unreadable files are skipped."""
    states: list[RankStateJSON] = []
    for path in state_dir.glob("rank-*.state"):
        try:
            states.append(read_rank_state(path))
        except (OSError, ValueError):
            continue
    states.sort(key=lambda s: s["rank"])
    return states


INCARNATION_EPOCH_FILE = "rank-epoch"


def mark_incarnation(state_dir: Path, epoch: str | None) -> None:
    """Record the group epoch this incarnation runs, beside its rank files (the name
    matches ``rank-*``, so :func:`archive_previous` moves it with them): the operator must
    tell a previous incarnation of this epoch (a crash) from one of an older epoch (the
    incarnation an in-place restart ended)."""
    path = state_dir / INCARNATION_EPOCH_FILE
    if epoch is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{INCARNATION_EPOCH_FILE}.{os.getpid()}.tmp")
    tmp.write_text(epoch)
    os.replace(tmp, path)


def previous_epoch(state_dir: Path) -> str | None:
    """The epoch the previous incarnation ran (None: unknown or none)."""
    try:
        return (state_dir / PREVIOUS_SUBDIR / INCARNATION_EPOCH_FILE).read_text().strip() or None
    except OSError:
        return None


def archive_previous(state_dir: Path) -> None:
    """Move the last incarnation's files to ``previous/`` before the ranks start again.

    The evidence of a crash must outlive the container restart it causes, so the
    operator can still read it from the agent after the ranks are back.
    """
    files = list(state_dir.glob("rank-*"))
    if not files:
        return
    previous = state_dir / PREVIOUS_SUBDIR
    previous.mkdir(parents=True, exist_ok=True)
    for old in previous.glob("rank-*"):
        old.unlink(missing_ok=True)
    for path in files:
        os.replace(path, previous / path.name)


ENGINE_EXIT_FILE = "rank-engine-exit.json"  # rank-*: archived with its incarnation


class EngineExitJSON(TypedDict):
    """How the engine (the SGLang server process) of an incarnation ended."""

    pid: int
    exit_code: int | None  # None when a signal ended it
    signal: str | None  # e.g. "SIGKILL" (SGLang's own kill_process_tree)
    ended_at: float
    hold_s: float  # how long the launcher kept the pod agent serving afterwards


def write_engine_exit(state_dir: Path, record: EngineExitJSON) -> None:
    """Atomically write ``rank-engine-exit.json`` (the launcher, once the engine ended)."""
    path = state_dir / ENGINE_EXIT_FILE
    tmp = path.with_name(f".{ENGINE_EXIT_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_engine_exit(state_dir: Path) -> EngineExitJSON | None:
    """The engine's exit record in ``state_dir``; None while it runs (or no record)."""
    try:
        data: EngineExitJSON = json.loads((state_dir / ENGINE_EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data
