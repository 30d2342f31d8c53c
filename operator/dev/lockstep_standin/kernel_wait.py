"""A wait inside the kernel, on purpose: the stand-in's ``stuck-in-kernel`` fault.

A GPU rank whose driver call never returns sits in uninterruptible sleep (``D`` in
``/proc/<pid>/stat``): its peers wait for it in the step's collective, and the pod agent
reads ``uninterruptible``. The stand-in has no driver, so it makes the same state the
kernel's own way: a ``vfork`` whose child does not exec keeps the parent in a killable
uninterruptible wait until the child ends (a fatal signal ends it; a driver's wait may
not even yield to that, which only matters to the restart, a SIGKILL either way).

Python cannot run code in a ``vfork`` child (it shares the parent's memory and stack),
so the wait is a few lines of C, built once with the system's C compiler into
``$LOCKSTEP_CACHE/kernel-wait/`` (default ``~/.cache/lockstep``) and called through
``ctypes`` (which lets go of the GIL: the rank's other threads, its state writer among
them, go on). The child asks the kernel to kill it when its parent dies
(``PR_SET_PDEATHSIG``) and checks its parent every 50 ms, so killing the rank ends both.
No compiler: :class:`KernelWaitUnavailable` says so, and the fault is not silently
skipped.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* The caller waits in vfork (uninterruptible) until the child ends: after
   `seconds`, or when the caller is killed. */
int lockstep_wait_in_kernel(unsigned int seconds) {
    pid_t parent = getpid();
    pid_t child = vfork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (unsigned int i = 0; i < seconds * 20 && getppid() == parent; i++) usleep(50000);
        _exit(0);
    }
    if (child < 0) return -1;
    int status = 0;
    return waitpid(child, &status, 0) == child ? 0 : -1;
}
"""


class KernelWaitUnavailable(RuntimeError):
    """The helper could not be built (no C compiler, or it failed)."""


def cache_root() -> Path:
    raw = os.environ.get("LOCKSTEP_CACHE")
    return (Path(raw) if raw else Path.home() / ".cache" / "lockstep") / "kernel-wait"


def library(root: Path | None = None) -> Path:
    """The built helper (built now if missing; the name carries the source's digest)."""
    root = root or cache_root()
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    lib = root / f"kernel-wait-{digest}.so"
    if lib.exists():
        return lib
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise KernelWaitUnavailable("no C compiler (cc, gcc) on PATH to build the helper")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        src, out = Path(tmp) / "kernel_wait.c", Path(tmp) / lib.name
        src.write_text(SOURCE)
        built = subprocess.run(
            [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(src)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if built.returncode != 0:
            raise KernelWaitUnavailable(f"{cc} failed: {built.stderr.strip()[-500:]}")
        out.replace(lib)  # atomic: a concurrent builder's copy is as good
    return lib


def wait_in_kernel(seconds: float, root: Path | None = None) -> None:
    """Sit in uninterruptible sleep for about `seconds` (whole seconds, at least one),
    or until this process is killed."""
    # use_errno: a failed vfork or waitpid is reported with its errno, not 0.
    fn = ctypes.CDLL(str(library(root)), use_errno=True).lockstep_wait_in_kernel
    fn.argtypes = [ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(max(1, round(seconds))) != 0:
        raise OSError(ctypes.get_errno(), "vfork or waitpid failed")
