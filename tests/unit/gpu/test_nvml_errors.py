"""`gpudra.gpu.nvml._nvml_errors`: everything pynvml raises leaves as a HardwareError.

The foreign classes are enumerated, not listed: every NVMLError_* class pynvml generates, every
NVML_ERROR_* code, and every other exception class pynvml defines or re-exports.
"""

from __future__ import annotations

import ctypes
import inspect
from typing import Any

import pynvml
import pytest

from gpudra import errors
from gpudra.gpu.nvml import _ABSENT, _ERROR_CLASSES, _GPU_GONE, _call, _mig_mode_refused, _nvml_errors

NVML_ERROR_CLASSES = sorted(
    (
        value
        for name, value in vars(pynvml).items()
        if name.startswith("NVMLError_") and inspect.isclass(value)
    ),
    key=lambda cls: cls.__name__,
)
NVML_ERROR_CODES = sorted(
    ((name, value) for name, value in vars(pynvml).items() if name.startswith("NVML_ERROR_")),
    key=lambda item: item[1],
)
# Codes with a class of their own; every other code is a plain HardwareError.
SPECIFIC = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: errors.NvmlUnavailable,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: errors.NvmlUnavailable,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: errors.NvmlUnavailable,
    pynvml.NVML_ERROR_NOT_SUPPORTED: errors.NotSupported,
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: errors.InsufficientResources,
    pynvml.NVML_ERROR_IN_USE: errors.InUse,
}
# pynvml's exception classes that are not NVMLErrors: translated, or a bug in gpudra left to surface.
OTHER_TRANSLATED: set[type[BaseException]] = {pynvml.NVMLLibraryMismatchError}
NOT_TRANSLATED: set[type[BaseException]] = {ctypes.ArgumentError}  # `from ctypes import *`: wrong argument


def _translated(error: BaseException, *, gpu: str | None = None) -> errors.HardwareError:
    with pytest.raises(errors.HardwareError) as caught, _nvml_errors("nvmlCall", gpu):
        raise error
    assert caught.value.__cause__ is error
    return caught.value


def test_the_enumerations_are_not_empty() -> None:
    """nvidia-ml-py 13.615: 31 codes, one generated class each."""
    assert len(NVML_ERROR_CLASSES) >= 31
    assert len(NVML_ERROR_CODES) == len(NVML_ERROR_CLASSES)
    assert {value for _, value in NVML_ERROR_CODES} == set(pynvml.NVMLError._valClassMapping)


@pytest.mark.parametrize("cls", NVML_ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_nvml_error_class_becomes_hardware_error(cls: type[pynvml.NVMLError]) -> None:
    error = cls()
    translated = _translated(error)
    assert type(translated) is SPECIFIC.get(error.value, errors.HardwareError)
    assert translated.nvml_error == cls.__name__
    assert str(translated) == f"nvmlCall failed: {error}"


@pytest.mark.parametrize(("name", "code"), NVML_ERROR_CODES, ids=[name for name, _ in NVML_ERROR_CODES])
def test_every_nvml_error_code_becomes_hardware_error(name: str, code: int) -> None:
    error = pynvml.NVMLError(code)
    expected_class = "NVMLError_" + "".join(
        part.capitalize() for part in name.removeprefix("NVML_ERROR_").split("_")
    )
    assert type(error).__name__ == expected_class
    translated = _translated(error, gpu="GPU-1")
    assert type(translated) is SPECIFIC.get(code, errors.HardwareError)
    assert translated.nvml_error == expected_class
    assert str(translated).startswith("nvmlCall on GPU GPU-1 failed: ")


@pytest.mark.parametrize(
    ("name", "code"),
    [(name, code) for name, code in NVML_ERROR_CODES if code != pynvml.NVML_SUCCESS],
    ids=[name for name, code in NVML_ERROR_CODES if code != pynvml.NVML_SUCCESS],
)
def test_every_mig_mode_activation_status_becomes_hardware_error(name: str, code: int) -> None:
    """nvmlDeviceSetMigMode returns its activation status rather than raising; the same classes apply."""
    refused = _mig_mode_refused("GPU-1", enabled=True, status=code)
    assert type(refused) is (errors.InUse if code == pynvml.NVML_ERROR_IN_USE else errors.HardwareError)
    assert refused.nvml_error == type(pynvml.NVMLError(code)).__name__
    assert str(refused).startswith(
        f"cannot enable MIG mode on GPU GPU-1: NVML activation status {name[11:]}, "
    )


def test_an_unknown_activation_status_is_named_by_its_number() -> None:
    refused = _mig_mode_refused("GPU-1", enabled=False, status=12345)
    assert (type(refused), refused.nvml_error) == (errors.HardwareError, None)
    assert "NVML activation status 12345," in str(refused)
    assert "nvidia-smi -i GPU-1 -mig 0" in str(refused)


def test_the_table_maps_only_real_codes() -> None:
    assert _ERROR_CLASSES == SPECIFIC
    codes = {value for _, value in NVML_ERROR_CODES}
    assert set(_ERROR_CLASSES) <= codes
    assert all(issubclass(cls, pynvml.NVMLError) for cls in _ABSENT)


def test_gpu_gone_names_are_real_pynvml_classes() -> None:
    names = ("GpuIsLost", "ResetRequired", "Unknown", "GpuNotFound", "NotFound")
    assert {f"NVMLError_{name}" for name in names} == _GPU_GONE
    for name in _GPU_GONE:
        cls = getattr(pynvml, name)
        assert inspect.isclass(cls)
        assert issubclass(cls, pynvml.NVMLError)
        assert cls in NVML_ERROR_CLASSES


def test_an_unknown_code_is_a_hardware_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml asks NVML for the text of a code it does not know; when that fails too, the code remains."""
    monkeypatch.setattr(pynvml.NVMLError, "_errcode_to_string", dict(pynvml.NVMLError._errcode_to_string))

    def undecodable(code: int) -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(pynvml, "nvmlErrorString", undecodable)
    error = pynvml.NVMLError(12345)
    assert type(error) is pynvml.NVMLError
    translated = _translated(error)
    assert type(translated) is errors.HardwareError
    assert translated.nvml_error == "NVMLError"
    assert str(translated) == "nvmlCall failed: NVML error 12345"


def test_every_other_pynvml_exception_class_is_accounted_for() -> None:
    """A new exception class in pynvml fails here until it is translated or known to be a bug."""
    others = {
        value
        for value in vars(pynvml).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and not issubclass(value, pynvml.NVMLError)
    }
    assert others == OTHER_TRANSLATED | NOT_TRANSLATED


def test_library_mismatch_is_a_hardware_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml turns FUNCTION_NOT_FOUND from its unversioned process-list functions into its own error."""

    def missing(name: str) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", missing)
    with pytest.raises(errors.HardwareError) as caught:
        _call(pynvml.nvmlDeviceGetComputeRunningProcesses, None, gpu="GPU-1")
    assert type(caught.value) is errors.HardwareError
    assert caught.value.nvml_error == "NVMLLibraryMismatchError"
    assert isinstance(caught.value.__cause__, pynvml.NVMLLibraryMismatchError)
    assert str(caught.value).startswith("nvmlDeviceGetComputeRunningProcesses on GPU GPU-1 failed: ")


def test_text_that_is_not_utf8_is_a_hardware_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def driver_version(buffer: Any, size: Any) -> int:
        buffer.value = b"\xff\xfe535"
        return 0  # NVML_SUCCESS

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lambda name: driver_version)
    with pytest.raises(errors.HardwareError) as caught:
        _call(pynvml.nvmlSystemGetDriverVersion, gpu=None)
    assert type(caught.value) is errors.HardwareError
    assert caught.value.nvml_error is None
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)
    assert str(caught.value) == "nvmlSystemGetDriverVersion failed: NVML returned text that is not UTF-8"


def test_a_missing_library_is_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """ctypes raises OSError for a missing libnvidia-ml.so.1; pynvml turns it into LIBRARY_NOT_FOUND."""

    def no_library(name: str, *args: object, **kwargs: object) -> Any:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    with pytest.raises(errors.NvmlUnavailable) as caught:
        _call(pynvml.nvmlInit, gpu=None)
    assert caught.value.nvml_error == "NVMLError_LibraryNotFound"
    assert str(caught.value) == "nvmlInit failed: NVML Shared Library Not Found"


@pytest.mark.parametrize(
    "error",
    [ctypes.ArgumentError("argument 1: wrong type"), TypeError("takes 1 positional argument"), KeyError("x")],
    ids=lambda error: type(error).__name__,
)
def test_bugs_are_not_translated(error: BaseException) -> None:
    with pytest.raises(type(error)), _nvml_errors("nvmlCall", None):
        raise error
