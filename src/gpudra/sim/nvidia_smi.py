"""Stand-in `nvidia-smi` for the simulated machine: compute mode, time-slice, --query-gpu. I/O: state file.

Accepts the command lines gpudra (and NVIDIA's drivers) run:
  nvidia-smi -i <index|uuid|bus id>[,...] -c DEFAULT|EXCLUSIVE_PROCESS|PROHIBITED|0|2|3
  nvidia-smi compute-policy -i <id> --set-timeslice 0|1|2|3
  nvidia-smi compute-policy -l [-i <id>]
  nvidia-smi --query-gpu=uuid,name,memory.total,pci.bus_id,compute_mode,... --format=csv[,noheader][,nounits]
and refuses what the real tool refuses: a compute mode on a MIG-enabled GPU (NVML wants a MIG device
handle there), a time-slice on a MIG device. Exit codes are nvidia-smi's: 2 bad argument,
3 not supported on the device, 6 device not found, 9 no driver.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpudra.sim import machines, state

OK, BAD_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, NO_DRIVER = 0, 2, 3, 6, 9

_COMPUTE_MODES = {"DEFAULT": 0, "EXCLUSIVE_THREAD": 1, "PROHIBITED": 2, "EXCLUSIVE_PROCESS": 3}
_COMPUTE_MODE_NAMES = {value: name for name, value in _COMPUTE_MODES.items()}
_TIMESLICES = ("Default", "Short", "Medium", "Long")


class _Failure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class _Target:
    """A GPU, or one MIG device on it (gi/ci set), picked by -i."""

    index: int
    gi: int | None = None
    ci: int | None = None


@dataclass(frozen=True)
class _Card:
    """The simulated machine's fixed facts together with its current state."""

    machine: machines.Machine
    current: state.MachineState

    @classmethod
    def of(cls, machine_state: state.MachineState) -> _Card:
        return cls(machines.MACHINES[machine_state.machine], machine_state)

    def targets(self, ids: str) -> list[_Target]:
        found = []
        for wanted in ids.split(","):
            target = self._target(wanted.strip())
            if target is None:
                raise _Failure(NOT_FOUND, "No devices were found")
            found.append(target)
        return found

    def _target(self, wanted: str) -> _Target | None:
        if wanted.isdigit():
            return _Target(int(wanted)) if int(wanted) < len(self.machine.gpus) else None
        for index, (slot, gpu) in enumerate(zip(self.machine.gpus, self.current.gpus, strict=True)):
            if wanted in (gpu.uuid, slot.bus_id) or wanted.lower() in (
                slot.bdf,
                slot.bdf.removeprefix("0000:"),
            ):
                return _Target(index)
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    if ci.uuid == wanted:
                        return _Target(index, gi.id, ci.id)
        return None

    def label(self, target: _Target) -> str:
        bus_id = self.machine.gpus[target.index].bus_id
        if target.gi is None:
            return f"GPU {bus_id}"
        return f"GPU instance {target.gi} compute instance {target.ci} of GPU {bus_id}"

    def compute_instance(self, target: _Target) -> state.ComputeInstanceState:
        gpu = self.current.gpus[target.index]
        gi = next(gi for gi in gpu.gpu_instances if gi.id == target.gi)
        return next(ci for ci in gi.compute_instances if ci.id == target.ci)

    def mig_mode(self, index: int) -> str:
        if not self.machine.gpus[index].model.mig_capable:
            return "[N/A]"
        return "Enabled" if self.current.gpus[index].mig_mode else "Disabled"


# --query-gpu field -> (unit, value)
_FIELDS: dict[str, tuple[str, Callable[[_Card, int], str]]] = {
    "index": ("", lambda card, i: str(i)),
    "uuid": ("", lambda card, i: card.current.gpus[i].uuid),
    "name": ("", lambda card, i: card.machine.gpus[i].model.name),
    "memory.total": ("MiB", lambda card, i: str(card.machine.gpus[i].model.memory_mib)),
    "pci.bus_id": ("", lambda card, i: card.machine.gpus[i].bus_id),
    "driver_version": ("", lambda card, i: card.machine.driver_version),
    "compute_mode": ("", lambda card, i: _COMPUTE_MODE_NAMES[card.current.gpus[i].compute_mode].title()),
    "mig.mode.current": ("", lambda card, i: card.mig_mode(i)),
}


def _options(args: list[str]) -> Iterator[tuple[str, str | None]]:
    """Yields (option, value) pairs; `--opt=value`, `-o value` and bare flags."""
    pending = iter(args)
    takes_value = {"-i", "--id", "-c", "--compute-mode", "--set-timeslice"}
    for arg in pending:
        if arg.startswith("--") and "=" in arg:
            option, value = arg.split("=", 1)
            yield option, value
        elif arg in takes_value:
            following = next(pending, None)
            if following is None:
                raise _Failure(BAD_ARGUMENT, f"Option {arg} needs a value.")
            yield arg, following
        else:
            yield arg, None


def _set_compute_mode(store: state.StateFile, *, ids: str, mode: str) -> list[str]:
    value = int(mode) if mode.isdigit() else _COMPUTE_MODES.get(mode.upper(), -1)
    if value not in _COMPUTE_MODE_NAMES or value == _COMPUTE_MODES["EXCLUSIVE_THREAD"]:
        raise _Failure(
            BAD_ARGUMENT, f'Invalid compute mode "{mode}"; valid: DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS'
        )
    name = _COMPUTE_MODE_NAMES[value]
    lines = []
    with store.update() as machine_state:
        card = _Card.of(machine_state)
        for target in card.targets(ids):
            label = card.label(target)
            holder: state.GpuState | state.ComputeInstanceState
            if target.gi is None:
                holder = machine_state.gpus[target.index]
                if holder.mig_mode:
                    raise _Failure(
                        NOT_SUPPORTED,
                        f"Unable to set the compute mode for {label}: Not Supported "
                        "(MIG mode is enabled; set it on a MIG device)",
                    )
            else:
                holder = card.compute_instance(target)
            if holder.compute_mode == value:
                lines.append(f"Compute mode is already set to {name} for {label}.")
            else:
                holder.compute_mode = value
                lines.append(f"Set compute mode to {name} for {label}.")
    return [*lines, "All done."]


def _set_timeslice(store: state.StateFile, *, ids: str, value: str) -> list[str]:
    if value not in ("0", "1", "2", "3"):
        raise _Failure(
            BAD_ARGUMENT, f'Invalid timeslice "{value}"; valid: 0 (default), 1 (short), 2 (medium), 3 (long)'
        )
    lines = []
    with store.update() as machine_state:
        card = _Card.of(machine_state)
        for target in card.targets(ids):
            if target.gi is not None or not card.machine.sharing_supported:
                raise _Failure(
                    NOT_SUPPORTED, f"Unable to set the timeslice for {card.label(target)}: Not Supported"
                )
            machine_state.gpus[target.index].timeslice = int(value)
            lines.append(f"Set timeslice to {_TIMESLICES[int(value)].upper()} for {card.label(target)}.")
    return lines


def _indices(card: _Card, ids: str | None) -> list[int]:
    return [t.index for t in card.targets(ids)] if ids else list(range(len(card.machine.gpus)))


def _list_policies(store: state.StateFile, ids: str | None) -> list[str]:
    card = _Card.of(store.read())
    rows = [f"| {'GPU':>3}  {'Policy':<10}  {'Value':<8} |"] + [
        f"| {index:>3}  {'Timeslice':<10}  {_TIMESLICES[card.current.gpus[index].timeslice]:<8} |"
        for index in _indices(card, ids)
    ]
    width = len(rows[0])
    rule = "+" + "-" * (width - 2) + "+"
    title = f"| {'GPU compute policies:':<{width - 4}} |"
    return [rule, title, rows[0], "|" + "=" * (width - 2) + "|", *rows[1:], rule]


def _query(store: state.StateFile, *, fields: str, fmt: str | None, ids: str | None) -> list[str]:
    options = (fmt or "").split(",")
    if options[0] != "csv":
        raise _Failure(BAD_ARGUMENT, '"--format=csv" is the supported format.')
    names = [name.strip() for name in fields.split(",")]
    for name in names:
        if name not in _FIELDS:
            raise _Failure(BAD_ARGUMENT, f'Field "{name}" is not a valid field to query.')
    card = _Card.of(store.read())
    units = "nounits" not in options
    lines = []
    if "noheader" not in options:
        # nvidia-smi keeps the unit in the header even with nounits
        lines.append(", ".join(f"{n} [{_FIELDS[n][0]}]" if _FIELDS[n][0] else n for n in names))
    for index in _indices(card, ids):
        values = []
        for name in names:
            unit, value = _FIELDS[name]
            values.append(f"{value(card, index)} {unit}" if unit and units else value(card, index))
        lines.append(", ".join(values))
    return lines


def _run(store: state.StateFile, args: list[str]) -> list[str]:
    policy = bool(args) and args[0] == "compute-policy"
    opts = dict(_options(args[1:] if policy else args))
    ids = opts.pop("-i", None) or opts.pop("--id", None)
    if policy:
        timeslice = opts.pop("--set-timeslice", None)
        listing = None in {opts.pop(flag, "") for flag in ("-l", "--list")}
        if not opts and timeslice is not None and ids:
            return _set_timeslice(store, ids=ids, value=timeslice)
        if not opts and listing and timeslice is None:
            return _list_policies(store, ids)
    else:
        mode = opts.pop("-c", None) or opts.pop("--compute-mode", None)
        query = opts.pop("--query-gpu", None)
        fmt = opts.pop("--format", None)
        if not opts and mode and ids and query is None:
            return _set_compute_mode(store, ids=ids, mode=mode)
        if not opts and query and mode is None:
            return _query(store, fields=query, fmt=fmt, ids=ids)
    raise _Failure(
        BAD_ARGUMENT, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
    )


def main(argv: list[str] | None = None) -> int:
    store = state.from_environment()
    if store is None:
        print(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            file=sys.stderr,
        )
        return NO_DRIVER
    try:
        lines = _run(store, sys.argv[1:] if argv is None else argv)
    except _Failure as failure:
        print(failure, file=sys.stderr)
        return failure.code
    print("\n".join(lines))
    return OK


if __name__ == "__main__":
    raise SystemExit(main())
