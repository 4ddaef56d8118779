#!/usr/bin/env python3
"""Every command the README shows is run by a test or by CI, so the README cannot drift.

The commands are the lines of the README's ```sh blocks (a trailing `# comment` dropped,
backslash continuations joined). COVERAGE below says, for each one, what runs it:

  run(group)          this script runs it as written, in a sandbox (below), as part of the
                      CTest of that group (GROUP_TESTS), and checks its exit status and the
                      output the README promises (expect);
  short(group)        a benchmark script: run as `XS_SHORT=1 <the command>`, the same script and
                      arguments in the script's short mode (no set-up or build, smallest sizes);
  args(group, cmd)    a benchmark binary: the same program, run with the smaller arguments cmd;
  ci(file)            a CI entry point runs it: the file must hold the command;
  ctest(regex)        that CTest runs it: `ctest -N -R regex` in the build must list it.

`check` fails when a README command has no entry, when an entry names a command the README no
longer shows, when a CI file no longer holds its command, or when a CTest named here (the
groups' own included) is not registered in the build. `run GROUP` runs the group's commands.

The sandbox is a temporary folder holding links to the repository's top-level entries, with
`build` linked to the build under test, so `build/...` and `scripts/...` resolve as in a
checkout and anything a command writes (checkpoints, out/, graphs/) stays in the sandbox.
XLA_SPAWN_JOB_TOKEN is set so multi-node commands do not create a token file in $HOME. A
command whose requirement is missing (the Fashion-MNIST files, PyTorch) is skipped with the
reason; the group then exits 77 (skipped) if everything else passed. A script that exits 77
itself (bench-multihost without root) skips too. On a CPU without AVX-512 a command's
OPENBLAS_CORETYPE=SkylakeX prefix is dropped (those kernels would die of SIGILL there), and a
Python line runs with /usr/bin first in PATH when the python3 found first lacks numpy or
torch and Debian's has them; the output says so.

Usage: readme_commands.py SOURCE_DIR BUILD_DIR check
       readme_commands.py SOURCE_DIR BUILD_DIR run GROUP
"""

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

SKIP = 77

# The CTest that runs each group; `check` requires every one of them to be registered. The
# single-host benchmarks are two groups, each with a limit of its own: as one group they took
# 217-254 s of their 270 s in CI on 2 cores.
GROUP_TESTS = {
    "tour": "ReadmeCommands.TheTourRuns",
    "bench-collectives": "ReadmeCommands.TheCollectiveBenchmarksRunInShortMode",
    "bench-training": "ReadmeCommands.TheTrainingBenchmarksRunInShortMode",
    "multihost": "ReadmeCommands.TheMultiHostBenchmarkRunsInShortMode",
    "demo": "ReadmeCommands.TheDemoRuns",
}
# The groups of benchmark commands, skipped when the build has none (XS_BUILD_BENCH=OFF).
BENCH_GROUPS = ("bench-collectives", "bench-training", "multihost")
# Wall-clock limit of a group, below the tests' CTest limit (300 s; stretched under sanitizers
# by XS_TEST_DEADLINE_SCALE, as scripts/sanitize sets it, and so is the CTest limit).
DEADLINE_SCALE = float(os.environ.get("XS_TEST_DEADLINE_SCALE", "1"))
GROUP_TIMEOUT_S = {g: s * DEADLINE_SCALE for g, s in {
    "tour": 240, "bench-collectives": 270, "bench-training": 270, "multihost": 240,
    "demo": 840}.items()}


@dataclass
class Entry:
    kind: str                      # run, short, args, ci, ctest
    where: str                     # group, CI file or CTest regex
    cmd: str = ""                  # args: the command actually run
    expect: list = field(default_factory=list)    # regexes the output must match
    requires: list = field(default_factory=list)  # data, torch, package, python, python-torch


def run(group, expect=(), requires=()):
    return Entry("run", group, expect=list(expect), requires=list(requires))


def short(group, expect=(), requires=()):
    return Entry("short", group, expect=list(expect), requires=list(requires))


def args(group, cmd, expect=(), requires=()):
    return Entry("args", group, cmd=cmd, expect=list(expect), requires=list(requires))


def ci(path):
    return Entry("ci", path)


def ctest(regex):
    return Entry("ctest", regex)


HELLO = "build/examples/hello_replicas"
COVERAGE = {
    # The demo as a user runs it, into a build folder of its own: it configures without the
    # tests, which must not happen to the build under test.
    "scripts/demo": args("demo", "XS_BUILD_DIR=$PWD/demo-build scripts/demo",
                         expect=[r"demo: set up and built in \d+ s", r"demo: done in \d+ s"],
                         requires=["data"]),
    "scripts/test": ci(".ci/run"),
    # The suite's build installed into a scratch prefix instead of /usr/local, the example
    # built in a scratch folder against it and run; the .deb packed and unpacked, not installed.
    "scripts/setup && cmake -S . -B build-install -G Ninja -DXS_BUILD_TESTS=OFF "
    "-DXS_BUILD_BENCH=OFF": ctest(r"^Package\.install$"),
    "cmake --build build-install && sudo cmake --install build-install --prefix /usr/local":
        ctest(r"^Package\.install$"),
    "cmake -S examples/out_of_tree -B /tmp/app && cmake --build /tmp/app": ctest(r"^Package\.install$"),
    "xla-spawn -n 2 -- /tmp/app/sum_replicas": ctest(r"^Package\.install$"),
    "scripts/package && sudo apt install ./build-package/xla-spawn_*.deb":
        ctest(r"^Package\.deb$"),
    'export PATH="$PWD/build/launcher:$PATH"': run("tour"),
    f"xla-spawn -n 4 -- {HELLO}": run("tour", expect=[r"\[3\] .*replica 3 of 4",
                                                      r"master: 4 replicas started"]),
    """xla-spawn -n 3 -- sh -c 'echo "working $RANK"; [ "$RANK" != 2 ] || exit 3; sleep 30'; """
    """echo "exit status $?\"""": run("tour", expect=[
        r"ordinal 2 exited with code 3; stopping the other 2 replica\(s\)",
        r"last 1 line\(s\) of ordinal 2:\n  \[2\] working 2",
        r"stopped by xla-spawn \(not failures\): ordinal\(s\) 0-1", r"\nexit status 3\n"]),
    "xla-spawn -n 4 --max-restarts 1 -- build/examples/train_fmnist --epochs 1 --checkpoint "
    "mlp.ckpt --checkpoint-every 50 --resume --fail-at-step 120": run("tour", expect=[
        r"ordinal 3 killed by signal 9", r"restarting all 4 replica\(s\): attempt 1",
        r"resumed from mlp\.ckpt: epoch \d+, batch 100, step 100"], requires=["data"]),
    "XLA_SPAWN_DUMP_GRAPHS=graphs build/examples/train_fmnist --max-steps 20 --no-eval --metrics":
        run("tour", expect=[
        r"Counter: CachedCompile\n  Value: 19\n", r"Counter: UncachedCompile\n  Value: 1\n"],
        requires=["data"]),
    f"xla-spawn --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 -n 2 -- {HELLO} &": run("tour"),
    f"xla-spawn --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 -n 2 -- {HELLO}; wait":
        run("tour", expect=[r"\[3\] .*replica 3 of 4 \(local 1 of 2\)",
                            r"master: 4 replicas started"]),
    "PYTHONPATH=build/python xla-spawn -n 4 -- python3 examples/python/numpy_all_reduce.py":
        run("tour", expect=[r"\[3\] ordinal 3 of 4: sum 10$"], requires=["python"]),
    "PYTHONPATH=build/python xla-spawn -n 2 -- python3 examples/python/ddp_fmnist.py --epochs 1":
        run("tour", expect=[r"result backend=xla_spawn world=2 accuracy=0\.(8[3-9]|9)"],
            requires=["python-torch", "data"]),
    "xla-spawn -n 4 --trace trace.json -- build/examples/train_fmnist --epochs 1 --max-steps 60 "
    "--no-eval": run("tour", expect=[r"trace of \d+ span\(s\) written to .*/trace\.json"],
                     requires=["data"]),
    "scripts/plot-trace trace.json --from 40 --steps 3":
        ctest(r"^TimelineTest\.PlotTraceDrawsAFewStepsOfATrainingJob$"),
    "xla-spawn --help": run("tour", expect=[r"usage: xla-spawn \[options\] -- COMMAND"]),
    "xla-spawn --version": run("tour", expect=[r"^xla-spawn \d+\.\d+\.\d+$"]),
    "scripts/bench-launch 200": short("bench-collectives", expect=[r"ratio xla-spawn/floor"]),
    "scripts/bench-allreduce --priority 2 8": short("bench-collectives", expect=[r"== N = 8"]),
    "scripts/bench-allreduce --priority --heap 2 8": short(
        "bench-collectives",
        expect=[r"== N = 8", r"torch\.distributed\.all_reduce \(xla_spawn backend\) vs C\+\+ "
                             r"on registered heap operands, N = 8|torch backend not timed"]),
    "scripts/bench-scaling --priority --rounds 8": short(
        "bench-training", expect=[r"round 1 N = 2 "], requires=["data"]),
    "scripts/bench-multihost --priority --runs 3": short(
        "multihost", expect=[r"2 hosts x 2 replicas, veth: medians over 1 run"]),
    "scripts/bench-python --reps 3": short(
        "bench-collectives", expect=[r"N = 2: xla_spawn \d+, gloo \d+, ratio"],
        requires=["torch", "package"]),
    "scripts/bench-trace --priority --rounds 15 --steps 1200": short(
        "bench-training", expect=[r"medians \(samples/s\): off \d+, on \d+; on / off"],
        requires=["data"]),
    "OPENBLAS_CORETYPE=SkylakeX scripts/bench-precision --priority --rounds 3 --steps 300": short(
        "bench-training", expect=[r"mlp N = 2: f32 \d+, bf16 \d+ samples/s, bf16 / f32",
                                  r"mlp all-reduce bf16\s*: all_reduce 1,339,412 B"],
        requires=["data"]),
    'scripts/bench-lm --replicas "1 2" --reps 2': short(
        "bench-training", expect=[r"N = 2: median tokens/s xla-spawn \d+, torch \d+"],
        requires=["torch"]),
    "OPENBLAS_CORETYPE=SkylakeX build/bench/runtime/runtime_bench": args(
        "bench-training", "OPENBLAS_CORETYPE=SkylakeX build/bench/runtime/runtime_bench --quick"),
    "OPENBLAS_CORETYPE=SkylakeX build/bench/runtime/train_bench --reps 90": args(
        "bench-training", "OPENBLAS_CORETYPE=SkylakeX build/bench/runtime/train_bench --reps 1"),
}


def readme_commands(source):
    """The README's shell commands in order: (line number, command)."""
    commands, block, pending = [], None, None
    lines = open(os.path.join(source, "README.md"), encoding="utf-8").read().split("\n")
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^\s*(```+|~~~+)\s*(\S*)", line)
        if fence and block is None:
            block = fence.group(2).lower()
            continue
        if fence and block is not None:
            block = None
            continue
        if block not in ("sh", "bash", "shell", "console", "zsh"):
            continue
        text = strip_comment(line).strip()
        if pending is not None:
            text = pending[1] + " " + text
            number = pending[0]
            pending = None
        if text.endswith("\\"):
            pending = (number, text[:-1].strip())
            continue
        if text:
            commands.append((number, re.sub(r"[ \t]+", " ", text)))
    return commands


def strip_comment(line):
    """The line without a trailing shell comment (a # outside quotes after a blank)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def program_of(cmd):
    """The first word that is not a VAR=value assignment."""
    words = shlex.split(cmd)
    return next((w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)), "")


def registered_tests(build):
    out = subprocess.run(["ctest", "-N"], cwd=build, capture_output=True, text=True, timeout=120)
    return re.findall(r"Test\s+#\d+:\s+(\S+)", out.stdout)


def check(source, build):
    problems = []
    shown = readme_commands(source)
    shown_set = {c for _, c in shown}
    for number, cmd in shown:
        if cmd not in COVERAGE:
            problems.append(f"README.md:{number}: `{cmd}` is run by no test: add it to COVERAGE in "
                            f"tests/docs/readme_commands.py with what runs it (a group, a CTest "
                            f"or a CI file)")
    for cmd in COVERAGE:
        if cmd not in shown_set:
            problems.append(f"COVERAGE names `{cmd}`, which README.md no longer shows")
    tests = registered_tests(build)
    missing_groups = set()
    for cmd, entry in COVERAGE.items():
        if entry.kind == "ci":
            path = os.path.join(source, entry.where)
            held = os.path.exists(path) and any(
                cmd in line and not line.lstrip().startswith("#")
                for line in open(path, encoding="utf-8"))
            if not held:
                problems.append(f"`{cmd}` is said to run in CI ({entry.where}), which does not run it")
        elif entry.kind == "ctest":
            if not any(re.search(entry.where, t) for t in tests):
                problems.append(f"`{cmd}` is said to run in the CTest /{entry.where}/, which is not "
                                f"registered in {build}")
        else:
            if entry.where not in GROUP_TESTS:
                problems.append(f"`{cmd}`: unknown group '{entry.where}'")
            elif GROUP_TESTS[entry.where] not in tests:
                missing_groups.add(entry.where)
            if entry.kind == "args" and program_of(entry.cmd) != program_of(cmd):
                problems.append(f"`{cmd}`: its short form `{entry.cmd}` runs another program")
            if entry.kind == "short" and not program_of(cmd).startswith("scripts/"):
                problems.append(f"`{cmd}`: short mode (XS_SHORT=1) is for scripts/; use args()")
    for group in sorted(missing_groups):
        problems.append(f"the CTest {GROUP_TESTS[group]}, which runs the README's '{group}' "
                        f"commands, is not registered in {build} (tests/CMakeLists.txt)")
    for p in problems:
        print(p)
    print(f"readme_commands: {len(shown)} README commands, {len(problems)} problem(s)")
    return 1 if problems else 0


def missing_requirement(entry, cmd, build):
    for need in entry.requires:
        if need == "data":
            data = os.environ.get("XLA_SPAWN_DATA_DIR", "/usr/share/datasets/fashion-mnist")
            if not os.path.isdir(data):
                return f"the Fashion-MNIST files ({data}; scripts/setup installs them)"
        if need == "torch" and not imports(DEBIAN_PYTHON, "torch"):
            return "PyTorch for /usr/bin/python3 (python3-torch, scripts/setup test)"
        if need == "package" and not os.path.isdir(os.path.join(build, "python", "xla_spawn")):
            return "the Python package (pybind11-dev, python3-dev: scripts/setup test)"
    modules = python_modules(entry)
    if modules:
        # The command runs `python3` from PATH with the package built in build/python.
        if not os.path.isdir(os.path.join(build, "python", "xla_spawn")):
            return "the Python package (pybind11-dev, python3-dev: scripts/setup test)"
        if not imports("python3", modules) and not imports(DEBIAN_PYTHON, modules):
            return f"a python3 that imports {modules} (Debian's, scripts/setup test)"
    return None


# What a command's `python3` must import ("python" and "python-torch" requirements), else None.
def python_modules(entry):
    if "python-torch" in entry.requires:
        return "numpy, torch"
    return "numpy" if "python" in entry.requires else None


# Asked once per interpreter and modules: importing torch takes seconds. An import that
# hangs counts as missing after IMPORT_TIMEOUT_S.
IMPORT_TIMEOUT_S = 120


@functools.lru_cache(maxsize=None)
def imports(python, modules):
    if shutil.which(python) is None:
        return False
    try:
        return subprocess.run([python, "-c", f"import {modules}"], capture_output=True,
                              timeout=IMPORT_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        return False


# The README's Python lines run `python3`, Debian's on a Debian machine, where scripts/setup
# installs numpy and torch and the package is built for it. Where another python3 comes first
# in PATH (pyenv's, say) and lacks them, such a line runs with /usr/bin first in PATH.
DEBIAN_PYTHON = "/usr/bin/python3"


def debian_python_first(entry):
    modules = python_modules(entry)
    return modules is not None and not imports("python3", modules)


# A README command that picks OpenBLAS's AVX-512 kernels. On a CPU without AVX-512 they would
# die of SIGILL, so there the command runs without this prefix: OpenBLAS then picks its own
# kernels, and the script, program and arguments are still the README's.
SKYLAKEX = "OPENBLAS_CORETYPE=SkylakeX "


def has_avx512():
    flags = open("/proc/cpuinfo").read()
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl"))


def make_sandbox(source, build):
    sandbox = tempfile.mkdtemp(prefix="readme-commands-")
    for name in os.listdir(source):
        if name.startswith("build") or name in ("out", ".git"):
            continue
        os.symlink(os.path.join(source, name), os.path.join(sandbox, name))
    os.symlink(os.path.abspath(build), os.path.join(sandbox, "build"))
    return sandbox


def run_group(source, build, group):
    if group not in GROUP_TESTS:
        sys.exit(f"readme_commands: unknown group '{group}' (expected {', '.join(GROUP_TESTS)})")
    if group in BENCH_GROUPS and not os.path.isdir(os.path.join(build, "bench")):
        print(f"readme_commands: group '{group}' skipped: {build} has no benchmarks "
              f"(configured with XS_BUILD_BENCH=OFF, as scripts/sanitize does)")
        return SKIP
    chosen, skipped, notes = [], [], []
    for number, cmd in readme_commands(source):
        entry = COVERAGE.get(cmd)
        if entry is None or entry.kind not in ("run", "short", "args") or entry.where != group:
            continue
        why = missing_requirement(entry, cmd, build)
        if why:
            skipped.append(f"README.md:{number}: `{cmd}` skipped: needs {why}")
            continue
        actual = {"run": cmd, "short": "XS_SHORT=1 " + cmd, "args": entry.cmd}[entry.kind]
        if debian_python_first(entry):
            actual = "PATH=/usr/bin:$PATH " + actual
            notes.append(f"README.md:{number}: `{cmd}` ran with /usr/bin first in PATH: the "
                         f"python3 found first lacks the modules Debian's python3 has")
        if SKYLAKEX in actual and not has_avx512():
            actual = actual.replace(SKYLAKEX, "")
            notes.append(f"README.md:{number}: `{cmd}` ran without {SKYLAKEX.strip()}: this CPU "
                         f"has no AVX-512, so OpenBLAS picked its own kernels")
        chosen.append((number, cmd, actual, entry))
    if not chosen:
        print("\n".join(skipped) or f"readme_commands: group '{group}' has no command")
        return SKIP if skipped else 1

    sandbox = make_sandbox(source, build)
    # One script, commands in README order, so `export` and `cmd &` ... `wait` work as in a
    # shell; each command's status is kept, and a marker line starts its output.
    lines = ["cd " + shlex.quote(sandbox)]
    for k, (number, cmd, actual, _) in enumerate(chosen):
        lines.append(f"echo {shlex.quote(f'@@readme {k}: {actual}')}")
        lines.append(actual)
        lines.append(f"echo \"@@status {k} $?\"")
    env = dict(os.environ, XLA_SPAWN_JOB_TOKEN="readme-commands-test-token")
    start = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", "\n".join(lines)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=GROUP_TIMEOUT_S[group])
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        print(output)
        print(f"readme_commands: group '{group}' did not finish within {GROUP_TIMEOUT_S[group]:.0f} s")
        return 1
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
    print(output)
    problems, script_skips = [], []
    for k, (number, cmd, actual, entry) in enumerate(chosen):
        begin = output.find(f"@@readme {k}: ")
        status = re.search(rf"^@@status {k} (\d+)$", output, re.M)
        if begin < 0 or status is None:
            problems.append(f"README.md:{number}: `{actual}` did not run to its end")
            continue
        if int(status.group(1)) == SKIP and entry.kind == "short":
            script_skips.append(f"README.md:{number}: `{actual}` skipped itself (exit 77)")
            continue
        if int(status.group(1)) != 0:
            problems.append(f"README.md:{number}: `{actual}` exited {status.group(1)}")
        after = output[begin:]
        for pattern in entry.expect:
            if not re.search(pattern, after, re.M):
                problems.append(f"README.md:{number}: `{actual}`: no output matching /{pattern}/")
    print(f"readme_commands: group '{group}': {len(chosen)} command(s) in "
          f"{time.monotonic() - start:.1f} s")
    for p in notes + problems + skipped + script_skips:
        print(p)
    if problems:
        return 1
    return SKIP if skipped or script_skips else 0


def main():
    source, build = (os.path.abspath(p) for p in sys.argv[1:3]) if len(sys.argv) > 3 else ("", "")
    if len(sys.argv) == 4 and sys.argv[3] == "check":
        return check(source, build)
    if len(sys.argv) == 5 and sys.argv[3] == "run":
        return run_group(source, build, sys.argv[4])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
