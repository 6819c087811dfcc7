"""Scratch names for the simulator's replace-by-rename writes of its fake sysfs, procfs and /dev trees.

Processes installing the same machine at once, and threads of one process (the plugin's health loops
each open NVML, which installs the simulated machine), each write their own scratch file and rename it
over the target, so a reader never sees a gap or half a file and no writer renames another's.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def scratch(path: Path) -> Path:
    """A hidden sibling of `path` that only this thread of this process writes."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
