"""``python3 -m xla_spawn -n 4 -- python3 train.py``: the xla-spawn launcher (see _launcher.py
for which one)."""

import os
import sys

from xla_spawn._launcher import NoLauncher, find_launcher

if __name__ == "__main__":
    try:
        launcher = find_launcher()
    except NoLauncher as e:
        sys.exit(f"python3 -m xla_spawn: {e}")
    os.execv(launcher, [launcher] + sys.argv[1:])
