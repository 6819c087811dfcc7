"""Checks that every ELF file under a root filesystem is built for one machine (`make release` runs it on
the arm64 image: a single x86-64 library or interpreter left in it would fail only on an arm64 node).

Reads each regular file's ELF header (symbolic links are not followed: their targets are checked where
they lie). Prints the count per machine; exits 1 and names each file built for another machine.

Usage: python scripts/elf_arch.py ROOT --machine aarch64|x86-64
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

# e_machine values (the ELF specification's registry).
MACHINES = {"x86-64": 62, "aarch64": 183}
NAMES = {number: name for name, number in MACHINES.items()}
ELF_MAGIC = b"\x7fELF"


def machine_of(path: Path) -> int | None:
    """The e_machine of an ELF file, or None for any other file."""
    with path.open("rb") as file:
        header = file.read(20)
    if len(header) < 20 or header[:4] != ELF_MAGIC:
        return None
    # EI_DATA (byte 5): 1 little-endian, 2 big-endian; e_machine is the u16 at offset 18.
    order = "<" if header[5] == 1 else ">"
    machine: int = struct.unpack_from(order + "H", header, 18)[0]
    return machine


def elf_files(root: Path) -> Iterator[tuple[Path, int]]:
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if path.is_symlink() or not path.is_file():
                continue
            machine = machine_of(path)
            if machine is not None:
                yield path, machine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--machine", required=True, choices=sorted(MACHINES))
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"elf_arch: {args.root} is not a directory", file=sys.stderr)
        return 2
    want = MACHINES[args.machine]
    counts: Counter[str] = Counter()
    wrong = []
    for path, machine in elf_files(args.root):
        counts[NAMES.get(machine, f"e_machine {machine}")] += 1
        if machine != want:
            wrong.append(f"{path.relative_to(args.root)}: {NAMES.get(machine, f'e_machine {machine}')}")
    summary = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    if not counts:
        print(f"elf_arch: no ELF file under {args.root}", file=sys.stderr)
        return 1
    if wrong:
        print(f"elf_arch: {len(wrong)} ELF files are not {args.machine} ({summary}):", file=sys.stderr)
        print("\n".join(wrong), file=sys.stderr)
        return 1
    print(f"elf_arch: all {counts[args.machine]} ELF files under {args.root} are {args.machine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
