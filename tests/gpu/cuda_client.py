"""A minimal CUDA client through the driver API (libcuda by ctypes): what a workload sees of its GPU.

Run as `python -m tests.gpu.cuda_client SIZE_MIB...`: creates a context on device 0, reads its
multiprocessor count and memory, tries to allocate each size in turn (keeping what it got) and prints
one JSON object. Under MPS the context belongs to the claim's MPS server, so the figures are the ones
the daemon's limits allow. No framework is needed: the driver ships libcuda.so.1.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
MIB = 1024**2


def _check(cuda: Any, code: int, call: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {code} {(name.value or b'?').decode()}")


def measure(sizes_mib: list[int]) -> dict[str, Any]:
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
        for pointer in pointers:
            cuda.cuMemFree_v2(pointer)
        return {
            "multiprocessors": multiprocessors.value,
            "free_mib": free.value // MIB,
            "total_mib": total.value // MIB,
            "allocations": allocations,
        }
    finally:
        cuda.cuCtxDestroy_v2(context)


if __name__ == "__main__":
    print(json.dumps(measure([int(arg) for arg in sys.argv[1:]])))
