"""``python3 -m xla_spawn -n 4 -- python3 train.py``: the xla-spawn launcher: XLA_SPAWN_LAUNCHER
when set, else the one beside this package (the build tree or the install prefix), else the
first on PATH."""

import os
import shutil
import sys


def _launcher():
    chosen = os.environ.get("XLA_SPAWN_LAUNCHER")
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            sys.exit(f"python3 -m xla_spawn: XLA_SPAWN_LAUNCHER={chosen} is not an executable file")
        return chosen
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (
        os.path.join(here, "..", "..", "launcher", "xla-spawn"),  # build tree: build/python/xla_spawn
        os.path.join(here, "..", "..", "..", "..", "bin", "xla-spawn"),  # <prefix>/lib/python3/dist-packages
        shutil.which("xla-spawn"),
    ):
        if candidate and os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return os.path.realpath(candidate)
    sys.exit("python3 -m xla_spawn: no xla-spawn launcher found (set XLA_SPAWN_LAUNCHER or put "
             "xla-spawn on PATH)")


if __name__ == "__main__":
    launcher = _launcher()
    os.execv(launcher, [launcher] + sys.argv[1:])
