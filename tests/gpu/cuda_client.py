"""A minimal CUDA client through the driver API (libcuda by ctypes): what a workload sees of its GPU.

Run as `python -m tests.gpu.cuda_client [--busy] SIZE_MIB...`: creates a context on device 0, reads
its multiprocessor count and memory, tries to allocate each size in turn (keeping what it got) and
prints one JSON line. Under MPS the context belongs to the claim's MPS server, so the figures are the
ones the daemon's limits allow. With `--busy` it then keeps the allocations and runs a spinning kernel
(PTX, compiled by the driver) back to back until its standard input closes: a workload that holds
memory and keeps the GPU busy. No framework is needed: the driver ships libcuda.so.1.
"""

from __future__ import annotations

import ctypes
import json
import select
import sys
from typing import Any

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
MIB = 1024**2
# One thread that spins for `cycles` clock ticks. PTX is forward compatible: the driver compiles it
# for whatever GPU this is.
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 cycles)
{
    .reg .u64 %rd<4>;
    .reg .pred %p;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
LOOP:
    mov.u64 %rd3, %clock64;
    sub.u64 %rd3, %rd3, %rd2;
    setp.lt.u64 %p, %rd3, %rd1;
    @%p bra LOOP;
    ret;
}
"""
SPIN_CYCLES = 200_000_000  # about 0.1 s at 1.5-2 GHz: the client checks its stdin between kernels


def _check(cuda: Any, code: int, call: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {code} {(name.value or b'?').decode()}")


def _spin_until_stdin_closes(cuda: Any) -> None:
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    _check(cuda, cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(SPIN_PTX)), "cuModuleLoadData")
    _check(cuda, cuda.cuModuleGetFunction(ctypes.byref(function), module, b"spin"), "cuModuleGetFunction")
    cycles = ctypes.c_uint64(SPIN_CYCLES)
    arguments = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(cycles), ctypes.c_void_p))
    while not select.select([sys.stdin], [], [], 0)[0]:
        _check(
            cuda,
            cuda.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, None, arguments, None),
            "cuLaunchKernel",
        )
        _check(cuda, cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    cuda.cuModuleUnload(module)


def measure(sizes_mib: list[int], *, busy: bool = False) -> dict[str, Any]:
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda, cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    _check(cuda, cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    _check(cuda, cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
    try:
        multiprocessors = ctypes.c_int()
        _check(
            cuda,
            cuda.cuDeviceGetAttribute(
                ctypes.byref(multiprocessors), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device
            ),
            "cuDeviceGetAttribute",
        )
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        _check(cuda, cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        allocations: list[dict[str, Any]] = []
        pointers = []
        for size in sizes_mib:
            pointer = ctypes.c_uint64()
            code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size * MIB))
            name = ctypes.c_char_p()
            cuda.cuGetErrorName(code, ctypes.byref(name))
            allocations.append({"mib": size, "code": code, "error": (name.value or b"").decode()})
            if code == 0:
                pointers.append(pointer)
        figures = {
            "multiprocessors": multiprocessors.value,
            "free_mib": free.value // MIB,
            "total_mib": total.value // MIB,
            "allocations": allocations,
        }
        if busy:
            print(json.dumps(figures), flush=True)
            _spin_until_stdin_closes(cuda)
        for pointer in pointers:
            cuda.cuMemFree_v2(pointer)
        return figures
    finally:
        cuda.cuCtxDestroy_v2(context)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    busy = "--busy" in arguments
    figures = measure([int(arg) for arg in arguments if arg != "--busy"], busy=busy)
    if not busy:
        print(json.dumps(figures))
