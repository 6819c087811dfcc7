"""`python -m gpudra.api.schema [DIRECTORY]`: regenerate the JSON Schemas (default ./api). I/O: writes files.

A module of its own so that `-m` does not re-run a module that `gpudra.api` has already imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpudra.api.schemas import write_schemas


def main(argv: list[str]) -> None:
    for path in write_schemas(Path(argv[0] if argv else "api")):
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
