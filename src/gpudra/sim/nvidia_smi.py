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
class _Field:
    header: str
    unit: str
    value: Callable[[machines.Machine, state.MachineState, int], str]


def _mig_mode(machine: machines.Machine, machine_state: state.MachineState, index: int) -> str:
    if not machine.gpus[index].model.mig_capable:
        return "[N/A]"
    return "Enabled" if machine_state.gpus[index].mig_mode else "Disabled"


_FIELDS = {
    "index": _Field("index", "", lambda m, s, i: str(i)),
    "uuid": _Field("uuid", "", lambda m, s, i: s.gpus[i].uuid),
    "name": _Field("name", "", lambda m, s, i: m.gpus[i].model.name),
    "memory.total": _Field("memory.total", "MiB", lambda m, s, i: str(m.gpus[i].model.memory_mib)),
    "pci.bus_id": _Field("pci.bus_id", "", lambda m, s, i: m.gpus[i].bus_id),
    "driver_version": _Field("driver_version", "", lambda m, s, i: m.driver_version),
    "compute_mode": _Field(
        "compute_mode", "", lambda m, s, i: _COMPUTE_MODE_NAMES[s.gpus[i].compute_mode].title()
    ),
    "mig.mode.current": _Field("mig.mode.current", "", _mig_mode),
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


def _targets(machine: machines.Machine, machine_state: state.MachineState, ids: str) -> list[_Target]:
    found = []
    for wanted in ids.split(","):
        target = _target(machine, machine_state, wanted.strip())
        if target is None:
            raise _Failure(NOT_FOUND, "No devices were found")
        found.append(target)
    return found


def _target(machine: machines.Machine, machine_state: state.MachineState, wanted: str) -> _Target | None:
    if wanted.isdigit():
        return _Target(int(wanted)) if int(wanted) < len(machine.gpus) else None
    for index, (slot, gpu) in enumerate(zip(machine.gpus, machine_state.gpus, strict=True)):
        if wanted in (gpu.uuid, slot.bus_id) or wanted.lower() in (slot.bdf, slot.bdf.removeprefix("0000:")):
            return _Target(index)
        for gi in gpu.gpu_instances:
            for ci in gi.compute_instances:
                if ci.uuid == wanted:
                    return _Target(index, gi.id, ci.id)
    return None


def _label(machine: machines.Machine, machine_state: state.MachineState, target: _Target) -> str:
    bus_id = machine.gpus[target.index].bus_id
    if target.gi is None:
        return f"GPU {bus_id}"
    return f"GPU instance {target.gi} compute instance {target.ci} of GPU {bus_id}"


def _compute_instance(machine_state: state.MachineState, target: _Target) -> state.ComputeInstance:
    gpu = machine_state.gpus[target.index]
    gi = next(gi for gi in gpu.gpu_instances if gi.id == target.gi)
    return next(ci for ci in gi.compute_instances if ci.id == target.ci)


def _set_compute_mode(store: state.StateFile, ids: str, mode_arg: str) -> list[str]:
    mode = int(mode_arg) if mode_arg.isdigit() else _COMPUTE_MODES.get(mode_arg.upper(), -1)
    if mode not in _COMPUTE_MODE_NAMES or mode == _COMPUTE_MODES["EXCLUSIVE_THREAD"]:
        raise _Failure(
            BAD_ARGUMENT, f'Invalid compute mode "{mode_arg}"; valid: DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS'
        )
    name = _COMPUTE_MODE_NAMES[mode]
    lines = []
    with store.update() as machine_state:
        machine = machines.MACHINES[machine_state.machine]
        for target in _targets(machine, machine_state, ids):
            label = _label(machine, machine_state, target)
            holder: state.Gpu | state.ComputeInstance
            if target.gi is None:
                holder = machine_state.gpus[target.index]
                if holder.mig_mode:
                    raise _Failure(
                        NOT_SUPPORTED,
                        f"Unable to set the compute mode for {label}: Not Supported "
                        "(MIG mode is enabled; set it on a MIG device)",
                    )
            else:
                holder = _compute_instance(machine_state, target)
            if holder.compute_mode == mode:
                lines.append(f"Compute mode is already set to {name} for {label}.")
            else:
                holder.compute_mode = mode
                lines.append(f"Set compute mode to {name} for {label}.")
    return [*lines, "All done."]


def _set_timeslice(store: state.StateFile, ids: str, value: str) -> list[str]:
    if value not in ("0", "1", "2", "3"):
        raise _Failure(
            BAD_ARGUMENT, f'Invalid timeslice "{value}"; valid: 0 (default), 1 (short), 2 (medium), 3 (long)'
        )
    lines = []
    with store.update() as machine_state:
        machine = machines.MACHINES[machine_state.machine]
        for target in _targets(machine, machine_state, ids):
            label = _label(machine, machine_state, target)
            if target.gi is not None:
                raise _Failure(NOT_SUPPORTED, f"Unable to set the timeslice for {label}: Not Supported")
            machine_state.gpus[target.index].timeslice = int(value)
            lines.append(f"Set timeslice to {_TIMESLICES[int(value)].upper()} for {label}.")
    return lines


def _list_policies(store: state.StateFile, ids: str | None) -> list[str]:
    machine_state = store.read()
    machine = machines.MACHINES[machine_state.machine]
    indices = [t.index for t in _targets(machine, machine_state, ids)] if ids else range(len(machine.gpus))
    rule = "+" + "-" * 37 + "+"
    lines = [rule, "| GPU compute policies:" + " " * 15 + "|", "| GPU  Policy            Value          |"]
    lines.append("|" + "=" * 37 + "|")
    for index in indices:
        value = _TIMESLICES[machine_state.gpus[index].timeslice]
        lines.append(f"| {index:>3}  {'Timeslice':<16}  {value:<14} |")
    return [*lines, rule]


def _query(store: state.StateFile, fields_arg: str, fmt: str | None, ids: str | None) -> list[str]:
    options = (fmt or "").split(",")
    if options[0] != "csv":
        raise _Failure(BAD_ARGUMENT, '"--format=csv" is the supported format.')
    names = [name.strip() for name in fields_arg.split(",")]
    for name in names:
        if name not in _FIELDS:
            raise _Failure(BAD_ARGUMENT, f'Field "{name}" is not a valid field to query.')
    machine_state = store.read()
    machine = machines.MACHINES[machine_state.machine]
    indices = [t.index for t in _targets(machine, machine_state, ids)] if ids else range(len(machine.gpus))
    units = "nounits" not in options
    fields = [_FIELDS[name] for name in names]
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(f"{f.header} [{f.unit}]" if f.unit and units else f.header for f in fields))
    for index in indices:
        values = [f.value(machine, machine_state, index) for f in fields]
        lines.append(
            ", ".join(f"{v} {f.unit}" if f.unit and units else v for f, v in zip(fields, values, strict=True))
        )
    return lines


def _run(store: state.StateFile, args: list[str]) -> list[str]:
    policy = bool(args) and args[0] == "compute-policy"
    opts = dict(_options(args[1:] if policy else args))
    ids = opts.pop("-i", None) or opts.pop("--id", None)
    if policy:
        timeslice = opts.pop("--set-timeslice", None)
        listing = None in {opts.pop(flag, "") for flag in ("-l", "--list")}
        if not opts and timeslice is not None and ids:
            return _set_timeslice(store, ids, timeslice)
        if not opts and listing and timeslice is None:
            return _list_policies(store, ids)
    else:
        mode = opts.pop("-c", None) or opts.pop("--compute-mode", None)
        query = opts.pop("--query-gpu", None)
        fmt = opts.pop("--format", None)
        if not opts and mode and ids and query is None:
            return _set_compute_mode(store, ids, mode)
        if not opts and query and mode is None:
            return _query(store, query, fmt, ids)
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
