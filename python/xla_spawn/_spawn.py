"""``xla_spawn.spawn(fn, args, nprocs)``: torch_xla's ``xmp.spawn`` over the xla-spawn launcher.

The launcher starts ``nprocs`` fresh interpreters; each prepares itself as multiprocessing's
"spawn" start method does (the parent's sys.path, working directory and main module, imported
as ``__mp_main__`` so that its ``if __name__ == "__main__":`` block does not run again), then
calls ``fn(ordinal, *args)``. ``fn`` and ``args`` travel pickled in a private file.
"""

import ctypes
import multiprocessing.spawn as mp_spawn
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time

from xla_spawn._core import Error
from xla_spawn._launcher import NoLauncher, find_launcher

_PAYLOAD_ENV = "XLA_SPAWN_SPAWN_PAYLOAD"
_BOOTSTRAP = "from xla_spawn._spawn import _replica_main; _replica_main()"


class JobFailed(Error):
    """The job that ``spawn`` ran failed; the launcher printed its summary on stderr.
    ``exit_code`` is the launcher's exit status (the root cause's)."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def spawn(fn, args=(), nprocs=None, launcher_args=()):
    """Runs ``fn(ordinal, *args)`` in ``nprocs`` replicas of a new job and returns when every
    one has finished, as torch_xla's ``xmp.spawn``.

    The replicas are fresh processes started by the xla-spawn launcher, with its supervision:
    the first that fails stops the others, and ``JobFailed`` is raised here with the
    launcher's exit status. ``fn`` must be importable by name (a module-level function of a
    module or of the main script) and ``args`` picklable, as with multiprocessing's "spawn"
    start method; call ``spawn`` under ``if __name__ == "__main__":``. ``nprocs`` defaults to
    the CPUs this process may run on; ``launcher_args`` are more xla-spawn options (e.g.
    ``["--max-restarts", "1"]``).
    """
    if os.environ.get("XLA_SPAWN_JOB_ID"):
        raise Error(
            f"spawn: this process is already ordinal {os.environ.get('XLA_SPAWN_ORDINAL')} of job "
            f"{os.environ['XLA_SPAWN_JOB_ID']}: call spawn() only under "
            "`if __name__ == \"__main__\":` in the script that starts the job")
    if nprocs is None:
        nprocs = len(os.sched_getaffinity(0))
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be an int >= 1, got {nprocs!r}")
    # A string would be taken apart into characters, each one an option to the launcher.
    for name, value in (("args", args), ("launcher_args", launcher_args)):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError(f"spawn: {name} must be a list or tuple, got {value!r}")
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if getattr(fn, "__module__", None) == "__main__" and not (main_file and os.path.isfile(main_file)):
        raise ValueError(
            "spawn: fn is defined in a main module the replicas cannot import (python3 -c, stdin "
            "or an interactive session): define it in a script file or a module")
    try:
        payload = pickle.dumps((fn, tuple(args)))
    except Exception as e:
        raise ValueError(f"spawn: fn and args must be picklable (a module-level function): {e}") from e
    try:
        launcher = find_launcher()
    except NoLauncher as e:
        raise Error(f"spawn: {e}") from None
    prep = mp_spawn.get_preparation_data("xla_spawn replica")
    prep.pop("authkey", None)  # multiprocessing's connection key: not needed, not picklable
    with tempfile.TemporaryDirectory(prefix="xla-spawn-") as private:  # mode 0700
        path = os.path.join(private, "payload")
        with open(path, "wb") as f:
            pickle.dump((prep, payload), f)
        command = [launcher, "-n", str(nprocs), *map(str, launcher_args), "--", sys.executable,
                   "-c", _BOOTSTRAP]
        code = _run(command, dict(os.environ, **{_PAYLOAD_ENV: path}))
    if code == 2:  # the launcher's usage error: no job ran
        raise JobFailed(f"spawn: xla-spawn refused its command line {command[1:-4]} (status 2; "
                        "its message is above, on stderr)", code)
    if code != 0:
        raise JobFailed(f"spawn: the job failed: xla-spawn exited with status {code} (its "
                        "summary is above, on stderr)", code)


def _die_with_parent():
    """In the launcher, before exec: SIGTERM when this process dies (its replicas follow)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


_SI_KERNEL = 0x80  # siginfo's si_code for a signal the terminal sent (Ctrl-C)
_POLL_S = 0.05
# The same signal again this soon is one interrupt delivered twice (a group kill and a wrapper
# such as `timeout` passing it on), as the launcher takes it too; a second Ctrl-C comes later.
_REPEAT_S = 0.5


def _run(command, env):
    """Runs the launcher and returns its exit status. SIGINT and SIGTERM to this process stop
    the job: the launcher stops the replicas (within its grace period) and reports, then
    SIGINT raises KeyboardInterrupt here and SIGTERM exits as it would have (the temporary
    directory removed). If this process dies outright, the launcher gets SIGTERM from the
    kernel. A Ctrl-C from the terminal reaches the launcher too (it shares this process
    group); a SIGINT sent to this process alone is passed on. A second SIGINT (more than half a
    second after the first) kills the job at once."""
    on_main = threading.current_thread() is threading.main_thread()
    watched = set()
    if on_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        watched.add(signal.SIGINT)
    if on_main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        watched.add(signal.SIGTERM)
    if not watched:
        return subprocess.Popen(command, env=env, preexec_fn=_die_with_parent).wait()
    # Taken with sigtimedwait, whose siginfo tells a Ctrl-C from a kill(), instead of handlers.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        launcher = subprocess.Popen(command, env=env,
                                    preexec_fn=lambda: _launcher_preexec(watched - blocked))
        interrupted_at = None
        while True:
            code = launcher.poll()
            if code is not None:
                break
            info = signal.sigtimedwait(watched, _POLL_S)
            if info is None:
                continue
            if info.si_signo == signal.SIGTERM:
                launcher.send_signal(signal.SIGTERM)
                launcher.wait()
                raise SystemExit(128 + signal.SIGTERM)
            now = time.monotonic()
            if interrupted_at is not None:
                if now - interrupted_at < _REPEAT_S:
                    continue  # the same interrupt, delivered twice
                launcher.kill()  # a second Ctrl-C: now (the replicas die with it)
                launcher.wait()
                break
            interrupted_at = now
            if info.si_code != _SI_KERNEL:
                launcher.send_signal(signal.SIGINT)
        if interrupted_at is not None:
            raise KeyboardInterrupt
        return code
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _launcher_preexec(unblock):
    if unblock:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
    _die_with_parent()


def _replica_main():
    path = os.environ.pop(_PAYLOAD_ENV)
    with open(path, "rb") as f:
        prep, payload = pickle.load(f)
    mp_spawn.prepare(prep)  # sys.path, cwd, and the main module as __mp_main__
    fn, args = pickle.loads(payload)
    import xla_spawn

    fn(xla_spawn.get_ordinal(), *args)
