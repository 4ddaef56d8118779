"""The xla_spawn Python module under the real launcher: collectives on NumPy arrays at N = 1..4,
bit-identical across replicas; C++ errors as Python exceptions with their message; a replica
killed mid-call fails the others within 2 s. Run by CTest (Python.Collectives) with
XS_LAUNCHER and PYTHONPATH pointing into the build tree.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import xla_spawn as xs

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.environ.get("XS_LAUNCHER", "xla-spawn")


def run_job(n, code=None, script=None, args=(), timeout=120, env=None):
    """Runs `python3 -c code` (or a script with args) under `xla-spawn -n n`; returns the
    completed process and the wall time."""
    program = [script, *args] if script else ["-c", textwrap.dedent(code)]
    command = [LAUNCHER, "-n", str(n), "--", sys.executable, *program]
    full_env = {**os.environ, "XLA_SPAWN_NO_TORCH": "1", **(env or {})}
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)
    return result, time.monotonic() - start


def lines_of(stdout, ordinal):
    """The lines ordinal `ordinal` printed (the launcher prefixes them with "[k] ")."""
    prefix = f"[{ordinal}] "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_dtype_and_op_is_right_and_bit_identical(n):
    result, _ = run_job(n, script=os.path.join(HERE, "replica_collectives.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    digests = [lines_of(result.stdout, k)[-1] for k in range(n)]
    assert all(d.startswith("digest ") for d in digests), digests
    assert len(set(digests)) == 1, digests


def test_alone_a_script_is_ordinal_0_of_1_and_collectives_are_identities():
    ctx = xs.context()
    assert (ctx.ordinal, ctx.world_size, ctx.standalone) == (0, 1, True)
    assert xs.is_master_ordinal() and xs.is_master_ordinal(local=False)
    data = np.arange(10, dtype=np.float64)
    xs.all_reduce(data, xs.REDUCE_MEAN)
    assert np.array_equal(data, np.arange(10, dtype=np.float64))


def test_bad_arguments_raise_with_the_message_that_names_them():
    with pytest.raises(xs.InvalidArgument, match=r"all_reduce: data has elements of format 'B'"):
        xs.all_reduce(np.zeros(3, np.uint8))
    with pytest.raises(xs.InvalidArgument, match=r"reduce op 'prod': expected 'sum', 'mean'"):
        xs.all_reduce(np.zeros(3, np.float32), "prod")
    with pytest.raises(ValueError, match=r"all_reduce: data must be a writable C-contiguous"):
        xs.all_reduce(np.zeros((3, 4), np.float32)[:, 1])
    read_only = np.zeros(3, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"writable"):
        xs.all_reduce(read_only)
    with pytest.raises(xs.InvalidArgument, match=r"all_gather: output of 5 f32 elements must be "
                       r"world size 1 times input of 4 f32 elements"):
        xs.all_gather(np.zeros(4, np.float32), np.zeros(5, np.float32))
    # Element types no reduction takes are moved as bytes, and named so.
    with pytest.raises(xs.InvalidArgument, match=r"all_gather: output of 24 bytes must be world "
                       r"size 1 times input of 3 f32 elements"):
        xs.all_gather(np.zeros(3, np.float32), np.zeros(24, np.uint8))
    with pytest.raises(xs.InvalidArgument, match=r"dtype='bf16' needs 2-byte elements"):
        xs.all_reduce(np.zeros(4, np.float32), dtype="bf16")
    assert issubclass(xs.PeerFailure, xs.Error) and issubclass(xs.Error, RuntimeError)


def test_shutdown_refuses_while_an_arena_array_lives_and_is_final():
    result, _ = run_job(1, """
        import numpy as np, xla_spawn as xs
        buffer = xs.alloc_buffer((2, 3), np.float32)
        assert buffer.shape == (2, 3) and buffer.dtype == np.float32
        try:
            xs.shutdown()
        except xs.InvalidArgument as e:
            print("refused:", e, flush=True)
        del buffer
        xs.shutdown()
        try:
            xs.all_reduce(np.ones(2, np.float32))  # rejoining would restart the call count
        except xs.InvalidArgument as e:
            print("after shutdown:", e, flush=True)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    out = lines_of(result.stdout, 0)
    assert "1 array(s) from alloc_buffer are still alive" in out[0], out
    assert "shutdown() was called: this process has left its job" in out[1], out


def test_alloc_buffer_takes_bf16_as_uint16_bits_for_the_bf16_reductions():
    result, _ = run_job(2, """
        import numpy as np, xla_spawn as xs
        data = xs.alloc_buffer(3, "bf16")
        assert data.dtype == np.uint16, data.dtype
        data[:] = np.array([1.5, -2.0, 3.0], np.float32).view(np.uint32) >> 16
        xs.all_reduce(data, dtype="bf16")
        print("sum:", (data.astype(np.uint32) << 16).view(np.float32).tolist(), flush=True)
        del data
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    for k in range(2):
        assert lines_of(result.stdout, k) == ["sum: [3.0, -4.0, 6.0]"], result.stdout


def test_python_objects_and_overlapping_operands_are_refused():
    with pytest.raises(xs.InvalidArgument, match=r"broadcast: data holds Python objects"):
        xs.broadcast(np.array(["a", {}], dtype=object))
    with pytest.raises(xs.InvalidArgument, match=r"alloc_buffer: dtype object holds Python objects"):
        xs.alloc_buffer(3, object)
    base = np.zeros(5, np.float32)
    with pytest.raises(xs.InvalidArgument, match=r"reduce_scatter: input and output overlap"):
        xs.reduce_scatter(base[:4], base[1:5])
    whole = np.arange(4, dtype=np.float32)
    xs.all_gather(whole, whole)  # in place: the input is this ordinal's chunk of the output
    assert np.array_equal(whole, np.arange(4, dtype=np.float32))


def test_calls_from_two_threads_are_serialised_and_shutdown_waits_for_them():
    # Before calls were serialised, two threads' all-reduces mixed inside the shared rounds
    # (results 0, 1 and 3 instead of 2), and shutdown() freed the communicator under a wait.
    result, _ = run_job(2, """
        import threading, numpy as np, xla_spawn as xs
        wrong = []
        def worker():
            for _ in range(300):
                a = np.ones(1000, np.float32)
                xs.all_reduce(a)
                if not np.all(a == 2):
                    wrong.append(a[:3])
        threads = [threading.Thread(target=worker) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print("wrong:", len(wrong), flush=True)
        late = threading.Thread(target=xs.barrier)
        late.start()
        xs.shutdown()  # waits for the barrier the other thread is in
        late.join()
        print("shut down after the barrier", flush=True)
    """)
    assert result.returncode == 0, result.stdout + result.stderr
    for k in range(2):
        assert lines_of(result.stdout, k) == ["wrong: 0", "shut down after the barrier"], result.stdout


def test_a_size_mismatch_is_a_peer_failure_naming_both_sides():
    result, _ = run_job(2, """
        import sys, numpy as np, xla_spawn as xs
        try:
            xs.all_reduce(np.ones(4 + xs.get_ordinal(), np.float32))
        except xs.PeerFailure as e:
            print("PeerFailure:", e, flush=True)
            sys.exit(3)
    """)
    assert result.returncode != 0
    failures = [line for k in range(2) for line in lines_of(result.stdout, k)
                if line.startswith("PeerFailure:")]
    assert failures, result.stdout + result.stderr
    for line in failures:
        assert "with 4 elements of f32" in line and "with 5 elements of f32" in line, line


def test_a_replica_killed_mid_call_fails_the_others_within_2_s():
    # The survivors ignore the launcher's SIGTERM so that what stops them is the library's
    # PeerFailure, not the launcher; the kill time and the failure times share CLOCK_REALTIME.
    result, _ = run_job(3, """
        import os, signal, sys, time
        import numpy as np, xla_spawn as xs
        signal.signal(signal.SIGTERM, lambda *_: None)
        xs.barrier()
        if xs.get_ordinal() == 1:
            time.sleep(0.2)  # the others are inside all_reduce, waiting for this one
            print(f"killed at {time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            xs.all_reduce(np.ones(1 << 20, np.float32))
        except xs.PeerFailure as e:
            print(f"failed at {time.time():.6f}: {e}", flush=True)
            sys.exit(3)
    """)
    assert result.returncode != 0
    killed = float(lines_of(result.stdout, 1)[0].split()[2])
    for k in (0, 2):
        line = lines_of(result.stdout, k)[0]
        assert line.startswith("failed at "), result.stdout + result.stderr
        assert float(line.split()[2].rstrip(":")) - killed < 2.0, line
        assert "ordinal 1" in line, line
    assert "ordinal 1 killed by signal 9" in result.stderr


def test_ctrl_c_inside_a_collective_raises_keyboard_interrupt_and_fails_the_peer(tmp_path):
    # Without the wait's signal check, ordinal 0 would hear SIGINT only once ordinal 1 came,
    # 5 s later. Ordinal 1 comes after the interrupt and must fail, not wait or succeed.
    result, _ = run_job(2, """
        import os, signal, sys, threading, time
        import numpy as np, xla_spawn as xs
        xs.barrier()
        ready = os.path.join(os.environ["XLA_SPAWN_TEST_DIR"], "interrupted")
        if xs.get_ordinal() == 0:
            main = threading.main_thread().ident
            sent = []
            def interrupt():
                time.sleep(0.3)  # ordinal 0 is inside all_reduce, waiting for ordinal 1
                sent.append(time.monotonic())
                signal.pthread_kill(main, signal.SIGINT)
            threading.Thread(target=interrupt).start()
            try:
                xs.all_reduce(np.ones(4, np.float32))
                print("all_reduce returned", flush=True)
            except KeyboardInterrupt:
                print(f"KeyboardInterrupt after {time.monotonic() - sent[0]:.3f} s", flush=True)
            open(ready, "w").close()
        else:
            for _ in range(200):  # at most 10 s
                if os.path.exists(ready):
                    break
                time.sleep(0.05)
            try:
                xs.all_reduce(np.ones(4, np.float32))
                print("all_reduce returned", flush=True)
            except xs.PeerFailure as e:
                print(f"PeerFailure: {e}", flush=True)
    """, env={"XLA_SPAWN_TEST_DIR": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    [zero] = lines_of(result.stdout, 0)
    assert zero.startswith("KeyboardInterrupt after "), result.stdout + result.stderr
    assert float(zero.split()[2]) < 2.0, zero
    [one] = lines_of(result.stdout, 1)
    assert one.startswith("PeerFailure: ") and "all_reduce on ordinal 0: interrupted" in one, one


def test_a_signal_handler_that_returns_lets_the_collective_finish_and_may_not_call_again():
    result, _ = run_job(2, """
        import signal, threading, time
        import numpy as np, xla_spawn as xs
        xs.barrier()
        heard = []
        def handler(signum, frame):
            heard.append(time.monotonic())
            try:
                xs.barrier()
            except xs.InvalidArgument as e:
                heard.append(str(e))
        signal.signal(signal.SIGUSR1, handler)
        if xs.get_ordinal() == 0:
            main = threading.main_thread().ident
            threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGUSR1)).start()
            start = time.monotonic()
            data = np.ones(4, np.float32)
            xs.all_reduce(data)
            print(f"sum {data[0]:g}, handler ran {heard[0] - start:.3f} s in: {heard[1]}",
                  flush=True)
        else:
            time.sleep(2.0)
            data = np.ones(4, np.float32)
            xs.all_reduce(data)
            print(f"sum {data[0]:g}", flush=True)
    """, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    [zero] = lines_of(result.stdout, 0)
    assert zero.startswith("sum 2, handler ran "), zero
    # Sent 0.3 s in, heard at the next check (100 ms apart), not at the end of the 2 s wait;
    # the rest of the margin is for a loaded machine.
    assert float(zero.split()[4]) < 1.6, zero
    assert "called from a signal handler while this thread is inside another call" in zero, zero
    assert lines_of(result.stdout, 1) == ["sum 2"], result.stdout


@pytest.mark.parametrize("arena_array", [False, True])
def test_a_daemon_thread_in_a_collective_at_exit_leaves_the_job(tmp_path, arena_array):
    # Ordinal 0 exits with a daemon thread inside an all_reduce too large to finish from the
    # part it posted; ordinal 1's matching call then fails, naming ordinal 0. An arena array
    # still alive at the exit used to wait for the call to end (its destructor took the lock)
    # and then abort, its communicator abandoned.
    result, _ = run_job(2, """
        import os, sys, threading, time
        import numpy as np, xla_spawn as xs
        xs.barrier()
        if os.environ["XLA_SPAWN_TEST_ARENA_ARRAY"] == "1":
            kept = xs.alloc_buffer(1024, np.float32)
        gone = os.path.join(os.environ["XLA_SPAWN_TEST_DIR"], "exiting")
        data = np.ones(4 << 20, np.float32)
        if xs.get_ordinal() == 0:
            threading.Thread(target=xs.all_reduce, args=(data,), daemon=True).start()
            time.sleep(0.3)
            open(gone, "w").close()
            sys.exit(0)
        for _ in range(200):  # at most 10 s
            if os.path.exists(gone):
                break
            time.sleep(0.05)
        time.sleep(0.5)
        try:
            xs.all_reduce(data)
            print("all_reduce returned", flush=True)
        except xs.PeerFailure as e:
            print(f"PeerFailure: {e}", flush=True)
    """, env={"XLA_SPAWN_TEST_DIR": str(tmp_path),
              "XLA_SPAWN_TEST_ARENA_ARRAY": "1" if arena_array else "0",
              "XLA_SPAWN_COLLECTIVE_TIMEOUT_MS": "20000"}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines_of(result.stdout, 0) == [], result.stdout
    [one] = lines_of(result.stdout, 1)
    assert one.startswith("PeerFailure: all_reduce on ordinal 1: ordinal 0 "), one


def test_an_arena_array_dropped_during_another_call_is_freed_after_it():
    # A thread, then a signal handler, drop the last view of an arena array while the main
    # thread's all_reduce waits for ordinal 1. Its destructor used to take the call's lock
    # with the GIL held, while the waiting call needed the GIL for its signal check: both
    # waited for ever, past the collective timeout. shutdown() proves both were freed.
    result, _ = run_job(2, """
        import signal, threading, time
        import numpy as np, xla_spawn as xs
        xs.barrier()
        arrays = [xs.alloc_buffer(16, np.float32), xs.alloc_buffer(16, np.float32)]
        if xs.get_ordinal() == 0:
            signal.signal(signal.SIGUSR1, lambda signum, frame: arrays.pop())
            main = threading.main_thread().ident
            threading.Timer(0.3, arrays.pop).start()
            threading.Timer(0.6, signal.pthread_kill, (main, signal.SIGUSR1)).start()
        else:
            time.sleep(1.5)
            arrays.clear()
        data = np.ones(4, np.float32)
        xs.all_reduce(data)
        xs.shutdown()
        print(f"sum {data[0]:g}, {len(arrays)} arrays left, shut down", flush=True)
    """, env={"XLA_SPAWN_COLLECTIVE_TIMEOUT_MS": "20000"}, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for k in range(2):
        assert lines_of(result.stdout, k) == ["sum 2, 0 arrays left, shut down"], result.stdout


def while_another_thread_calls(body, peer_wait, after=""):
    """A job script: ordinal 0 runs `body` while another of its threads is inside an
    all_reduce that ordinal 1 joins only `peer_wait` s later; then both run `after`."""
    indent = lambda code, n: textwrap.indent(textwrap.dedent(code).strip("\n"), " " * n)
    return f"""
import os, signal, threading, time
import numpy as np, xla_spawn as xs
xs.barrier()
if xs.get_ordinal() == 0:
    other = threading.Thread(target=xs.all_reduce, args=(np.ones(4, np.float32),))
    other.start()
{indent(body, 4)}
    other.join()
else:
    time.sleep({peer_wait})
    xs.all_reduce(np.ones(4, np.float32))
{indent(after, 0)}
"""


def test_ctrl_c_while_another_threads_call_holds_the_communicator_is_heard_at_once():
    # The main thread's barrier waits for the other thread's all_reduce, which waits 3 s for
    # ordinal 1: the interrupt used to be heard only when that call ended.
    result, _ = run_job(2, while_another_thread_calls("""
        time.sleep(0.1)
        main = threading.main_thread().ident
        threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT)).start()
        start = time.monotonic()
        try:
            xs.barrier()
        except KeyboardInterrupt:
            print(f"KeyboardInterrupt after {time.monotonic() - start:.3f} s", flush=True)
    """, 3, """
        xs.barrier()  # nothing was poisoned: the interrupted barrier never began
        print("done", flush=True)
    """), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    zero = lines_of(result.stdout, 0)
    assert len(zero) == 2 and zero[0].startswith("KeyboardInterrupt after "), result.stdout
    # Sent 0.3 s in and heard at the next check (100 ms apart); the margin is for a loaded
    # machine, under the 2.7 s the other call still waits.
    assert float(zero[0].split()[2]) < 2.0, zero
    assert zero[1] == "done" and lines_of(result.stdout, 1) == ["done"], result.stdout


def test_a_child_forked_while_another_thread_is_in_a_call_is_refused_not_stuck():
    # The child inherits the communicator's lock held by a thread it does not have: its call
    # used to wait for it for ever.
    result, _ = run_job(2, while_another_thread_calls("""
        time.sleep(0.3)
        pid = os.fork()
        if pid == 0:
            try:
                xs.all_reduce(np.ones(4, np.float32))
                print("child: all_reduce returned", flush=True)
            except xs.InvalidArgument as e:
                print(f"child: {e}", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """, 2, """
        print("done", flush=True)
    """), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    zero = lines_of(result.stdout, 0)
    assert len(zero) == 2 and zero[1] == "done", result.stdout
    assert zero[0].startswith("child: xla_spawn: this process was forked from pid "), zero
    assert zero[0].endswith("which owns the communicator; only that process may call its "
                            "collectives"), zero


def test_mesh_reduce_and_rendezvous_carry_python_values():
    result, _ = run_job(3, """
        import xla_spawn as xs
        merged = xs.mesh_reduce("dicts", {xs.get_ordinal(): "x" * xs.get_ordinal()},
                                lambda ds: {k: v for d in ds for k, v in d.items()})
        print(sorted(merged.items()), flush=True)
    """)
    assert result.returncode == 0, result.stderr
    for k in range(3):
        assert lines_of(result.stdout, k) == ["[(0, ''), (1, 'x'), (2, 'xx')]"]


SPAWN_SCRIPT = """
import sys
import numpy as np
import xla_spawn as xs

print("main module imported as", __name__, flush=True)


def _mp_fn(ordinal, base, fail):
    data = np.full(4, base + ordinal, np.float32)
    xs.all_reduce(data)
    print(f"ordinal {ordinal} of {xs.world_size()}: sum {data[0]:g}", flush=True)
    if ordinal == fail:
        raise ValueError(f"ordinal {ordinal} fails")


if __name__ == "__main__":
    try:
        xs.spawn(_mp_fn, args=(int(sys.argv[1]), int(sys.argv[2])), nprocs=3)
        print("spawn returned", flush=True)
    except xs.JobFailed as e:
        print("JobFailed", e.exit_code, flush=True)
"""


def test_spawn_runs_fn_in_every_replica_as_xmp_spawn_and_raises_when_the_job_fails(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SPAWN_SCRIPT)
    env = dict(os.environ, XLA_SPAWN_LAUNCHER=LAUNCHER, XLA_SPAWN_NO_TORCH="1")
    ok = subprocess.run([sys.executable, str(script), "1", "-1"], capture_output=True, text=True,
                        timeout=120, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The parent ran the main block once; each replica imported the script as __mp_main__.
    assert ok.stdout.count("main module imported as __main__") == 1, ok.stdout
    for k in range(3):
        assert lines_of(ok.stdout, k) == ["main module imported as __mp_main__",
                                          f"ordinal {k} of 3: sum 6"], ok.stdout
    assert ok.stdout.rstrip().endswith("spawn returned"), ok.stdout
    failed = subprocess.run([sys.executable, str(script), "1", "2"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert failed.returncode == 0, failed.stdout + failed.stderr
    assert failed.stdout.rstrip().endswith("JobFailed 1"), failed.stdout
    assert "ValueError: ordinal 2 fails" in failed.stderr, failed.stderr


def test_spawn_refuses_inside_a_replica_and_an_unpicklable_fn():
    result, _ = run_job(1, """
        import xla_spawn as xs
        try:
            xs.spawn(print, nprocs=1)
        except xs.Error as e:
            print("refused:", e, flush=True)
    """)
    assert result.returncode == 0, result.stderr
    [line] = lines_of(result.stdout, 0)
    assert "spawn: this process is already ordinal 0 of job" in line, line
    with pytest.raises(ValueError, match=r"fn and args must be picklable"):
        xs.spawn(lambda ordinal: None, nprocs=1)
    with pytest.raises(ValueError, match=r"nprocs must be an int >= 1, got 0"):
        xs.spawn(print, nprocs=0)
    # A string used to become one launcher option per character ("command not found: -").
    with pytest.raises(TypeError, match=r"launcher_args must be a list or tuple, got '--timeout 5'"):
        xs.spawn(print, nprocs=1, launcher_args="--timeout 5")
    with pytest.raises(TypeError, match=r"args must be a list or tuple, got 5"):
        xs.spawn(print, args=5, nprocs=1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_spawn_passes_sigterm_on_and_leaves_nothing_behind(tmp_path, sig):
    # SIGTERM to the script that called spawn stops the job (the replicas would otherwise run
    # on) and removes spawn's private directory (here under TMPDIR). SIGKILL leaves the
    # directory, but the launcher dies with the script (PR_SET_PDEATHSIG) and its replicas too.
    script = tmp_path / "sleepy.py"
    script.write_text(textwrap.dedent("""
        import os, time
        import xla_spawn as xs

        def _mp_fn(ordinal, where):
            path = os.path.join(where, f"pid.{ordinal}")
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(path + ".tmp", path)  # whole, as the test reads it
            time.sleep(60)

        if __name__ == "__main__":
            xs.spawn(_mp_fn, args=(os.environ["PIDS"],), nprocs=2)
    """))
    pids = tmp_path / "pids"
    pids.mkdir()
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, XLA_SPAWN_LAUNCHER=LAUNCHER, XLA_SPAWN_NO_TORCH="1", PIDS=str(pids),
               TMPDIR=str(temp))
    parent = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(pids.glob("pid.?"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    replicas = [int(p.read_text()) for p in pids.glob("pid.?")]
    assert len(replicas) == 2, parent.communicate(timeout=30)
    parent.send_signal(sig)
    _, err = parent.communicate(timeout=30)
    assert parent.returncode == (128 + sig if sig == signal.SIGTERM else -sig), err

    def gone(pid):
        try:
            return open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10  # the launcher's grace period is 3 s
    while not all(gone(pid) for pid in replicas) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in replicas), replicas
    if sig == signal.SIGTERM:
        assert list(temp.iterdir()) == [], list(temp.iterdir())


@pytest.mark.parametrize("how", ["terminal", "kill", "group"])
def test_spawn_stops_the_job_gracefully_on_one_ctrl_c_from_the_terminal_or_a_kill(tmp_path, how):
    # Ctrl-C at a terminal reaches the script and the launcher (one process group): the script
    # must not pass it on as well, which the launcher would take for a second Ctrl-C (kill at
    # once). A SIGINT sent to the script alone (kill, Jupyter's interrupt) is passed on at once.
    # A SIGINT to a group under `timeout`, which sends it on again to the script and the
    # group, reaches everyone two or three times within milliseconds: still one interrupt.
    # Either way the replicas get one SIGINT and finish their clean-up.
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import os, time
        import xla_spawn as xs

        def _mp_fn(ordinal, where):
            try:
                with open(os.path.join(where, f"pid.{ordinal}.tmp"), "w") as f:
                    f.write(str(os.getpid()))
                os.rename(os.path.join(where, f"pid.{ordinal}.tmp"),
                          os.path.join(where, f"pid.{ordinal}"))
                time.sleep(60)
            except KeyboardInterrupt:
                time.sleep(1)  # cleaning up: a second SIGINT (SIGKILL) now would cut this
                open(os.path.join(where, f"clean.{ordinal}"), "w").close()

        if __name__ == "__main__":
            try:
                xs.spawn(_mp_fn, args=(os.environ["PIDS"],), nprocs=2)
            except KeyboardInterrupt:
                print("KeyboardInterrupt", flush=True)
    """))
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(os.environ, XLA_SPAWN_LAUNCHER=LAUNCHER, XLA_SPAWN_NO_TORCH="1", PIDS=str(pids))
    if how == "terminal":
        import fcntl
        import pty
        import termios
        try:
            master, slave = pty.openpty()
        except OSError as e:
            pytest.skip(f"no pseudo-terminal to send Ctrl-C from: {e}")
        parent = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
    elif how == "group":
        parent = subprocess.Popen(["timeout", "60", sys.executable, str(script)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    else:
        parent = subprocess.Popen([sys.executable, str(script)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.glob("pid.?"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(pids.glob("pid.?"))) == 2
        sent = time.monotonic()
        if how == "terminal":
            os.write(master, b"\x03")
        elif how == "group":
            os.killpg(parent.pid, signal.SIGINT)
        else:
            parent.send_signal(signal.SIGINT)
        parent.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    if how == "terminal":
        output = b""
        try:
            while chunk := os.read(master, 65536):
                output += chunk
        except OSError:  # EIO: the other side is closed
            pass
        os.close(master)
    else:
        output = parent.stdout.read()
    output = output.decode(errors="replace")
    assert parent.returncode == 0 and output.rstrip().endswith("KeyboardInterrupt"), output
    assert sorted(p.name for p in pids.glob("clean.?")) == ["clean.0", "clean.1"], output
    assert "killing" not in output, output
    assert took < 8, (took, output)  # the replicas' 1 s clean-up, well inside the 3 s grace


def test_spawn_refuses_a_fn_from_python_c_and_names_a_launcher_usage_error(tmp_path):
    env = dict(os.environ, XLA_SPAWN_LAUNCHER=LAUNCHER, XLA_SPAWN_NO_TORCH="1")
    inline = subprocess.run(
        [sys.executable, "-c", "import xla_spawn as xs\ndef f(o): pass\nxs.spawn(f, nprocs=1)"],
        capture_output=True, text=True, timeout=60, env=env)
    assert inline.returncode != 0
    assert "fn is defined in a main module the replicas cannot import" in inline.stderr, inline.stderr
    script = tmp_path / "bad_flag.py"
    script.write_text(textwrap.dedent("""
        import xla_spawn as xs

        def _mp_fn(ordinal):
            pass

        if __name__ == "__main__":
            try:
                xs.spawn(_mp_fn, nprocs=1, launcher_args=["--bogus"])
            except xs.JobFailed as e:
                print(e.exit_code, e, flush=True)
    """))
    bad = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert bad.stdout.startswith("2 spawn: xla-spawn refused its command line"), bad.stdout


def test_python_m_xla_spawn_runs_the_launcher():
    env = dict(os.environ, XLA_SPAWN_LAUNCHER=LAUNCHER, XLA_SPAWN_NO_TORCH="1")
    result = subprocess.run(
        [sys.executable, "-m", "xla_spawn", "-n", "2", "--", sys.executable, "-c",
         "import xla_spawn as xs; print(xs.get_ordinal(), xs.world_size())"],
        capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(lines_of(result.stdout, 0) + lines_of(result.stdout, 1)) == ["0 2", "1 2"]
