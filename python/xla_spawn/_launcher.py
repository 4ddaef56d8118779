"""Which xla-spawn launcher the package runs: XLA_SPAWN_LAUNCHER when set, else the one beside
this package (the build tree or the install prefix), else the first on PATH."""

import os
import shutil


class NoLauncher(RuntimeError):
    """No usable xla-spawn launcher was found."""


def find_launcher():
    chosen = os.environ.get("XLA_SPAWN_LAUNCHER")
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise NoLauncher(f"XLA_SPAWN_LAUNCHER={chosen} is not an executable file")
        return chosen
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (
        os.path.join(here, "..", "..", "launcher", "xla-spawn"),  # build tree: build/python/xla_spawn
        # <prefix>/lib/python3[.X]/dist-packages/xla_spawn
        os.path.join(here, "..", "..", "..", "..", "bin", "xla-spawn"),
        shutil.which("xla-spawn"),
    ):
        if candidate and os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return os.path.realpath(candidate)
    raise NoLauncher("no xla-spawn launcher found (set XLA_SPAWN_LAUNCHER or put xla-spawn on PATH)")
