"""`python -m gpudra.sim`: raise a fault on a simulated machine from a shell (the demo's), on the machine
in $GPUDRA_SIM_STATE or `--state`: `xid GPU-… 79 [--gpu-instance N]`, `double-bit-ecc GPU-…`,
`lost GPU-… on|off`, `memory GPU-… row-remap-pending|row-remap-failed|retired-pages-pending on|off`,
`nvlink GPU-… LINK down|up`, `single-bit-ecc GPU-…`, `clocks GPU-… [hw_slowdown …]`. I/O: the state
file (through `hooks`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpudra.sim import hardware, hooks, state


def main(argv: list[str] | None = None) -> int:
    """Raise a fault on a simulated machine: an XID, a double-bit ECC error, a lost GPU, a memory repair,
    an NVLink down."""
    parser = argparse.ArgumentParser(prog="python -m gpudra.sim", description=main.__doc__)
    parser.add_argument("--state", default=os.environ.get(state.ENVIRONMENT), help="the machine's state file")
    faults = parser.add_subparsers(dest="fault", required=True)
    xid = faults.add_parser("xid", help="an XID critical-error event")
    xid.add_argument("gpu", help="GPU UUID")
    xid.add_argument("xid", type=int)
    xid.add_argument("--gpu-instance", type=int, default=None, help="the GPU instance it is attributed to")
    ecc = faults.add_parser("double-bit-ecc", help="an uncorrectable ECC error (and its XID 48)")
    ecc.add_argument("gpu", help="GPU UUID")
    ecc.add_argument("--gpu-instance", type=int, default=None)
    lost = faults.add_parser("lost", help="the GPU falls off the bus (on) or is back after a reset (off)")
    lost.add_argument("gpu", help="GPU UUID")
    lost.add_argument("state_", choices=["on", "off"], metavar="on|off")
    single = faults.add_parser("single-bit-ecc", help="a corrected ECC error event")
    single.add_argument("gpu", help="GPU UUID")
    clocks = faults.add_parser("clocks", help="what holds the clocks down from now on (none: nothing)")
    clocks.add_argument("gpu", help="GPU UUID")
    clocks.add_argument("reasons", nargs="*", choices=list(hooks.CLOCK_SLOWDOWNS), metavar="REASON")
    memory = faults.add_parser("memory", help="a memory repair queued for the next reset, or a failed one")
    memory.add_argument("gpu", help="GPU UUID")
    memory.add_argument("condition", choices=hooks.MEMORY_CONDITIONS)
    memory.add_argument("state_", choices=["on", "off"], metavar="on|off")
    nvlink = faults.add_parser("nvlink", help="an NVLink goes down or trains again")
    nvlink.add_argument("gpu", help="GPU UUID")
    nvlink.add_argument("link", type=int)
    nvlink.add_argument("state_", choices=["down", "up"], metavar="down|up")
    args = parser.parse_args(argv)
    if not args.state or not Path(args.state).exists():
        print(f"no simulated machine: set --state or ${state.ENVIRONMENT}", file=sys.stderr)
        return 2
    path = Path(args.state)
    try:
        if args.fault == "xid":
            hooks.raise_xid(
                state_file=path, gpu_uuid=args.gpu, xid=args.xid, gpu_instance_id=args.gpu_instance
            )
        elif args.fault == "double-bit-ecc":
            hooks.raise_double_bit_ecc(state_file=path, gpu_uuid=args.gpu, gpu_instance_id=args.gpu_instance)
        elif args.fault == "single-bit-ecc":
            hooks.raise_single_bit_ecc(state_file=path, gpu_uuid=args.gpu)
        elif args.fault == "clocks":
            hooks.set_clock_slowdown(state_file=path, gpu_uuid=args.gpu, reasons=args.reasons)
        elif args.fault == "memory":
            hooks.set_memory_condition(
                state_file=path, gpu_uuid=args.gpu, condition=args.condition, on=args.state_ == "on"
            )
        elif args.fault == "nvlink":
            hooks.set_nvlink_down(
                state_file=path, gpu_uuid=args.gpu, link=args.link, down=args.state_ == "down"
            )
        else:
            hooks.set_gpu_lost(state_file=path, gpu_uuid=args.gpu, lost=args.state_ == "on")
    except hardware.Refused as refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
