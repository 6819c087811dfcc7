"""CDI specs for prepared claims, and the NVIDIA toolkit's specs they compose with. I/O: CDI spec files.

Building a spec (`build_claim_spec`) is pure; writing, deleting, listing and reading specs is I/O.

One transient spec per claim: kind `<driver>/claim`, file `<cdi root>/<driver>-claim_<claim UID>.json`
(the CDI library's transient-spec naming; JSON because every runtime reads it and the plugin needs
no YAML writer), one CDI device per allocated device named `<claim UID>-<device name>`, so IDs look
like `gpu.gpudra.io/claim=<claim UID>-gpu-0` and never collide between claims.

What the spec gives a container:
- spec-wide: the control nodes `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`;
- per device: `/dev/nvidia<minor>` (the parent GPU's for MIG), for MIG the GPU-instance and
  compute-instance capability nodes `/dev/nvidia-caps/nvidia-cap<N>` (fully specified, type, major
  and minor, because the host need not have created them), `NVIDIA_VISIBLE_DEVICES=<its UUID>`, and
  the device's sharing edits (MPS env and mounts).

Where the nodes are on the host: the runtime stats each node it is not told the type, major and minor of
(`/dev/nvidia<minor>`, `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`) and fails the
container when it is missing. By default it looks at the same path on the host. With a dev root
(`--dev-root`, the host directory whose `dev/` holds the NVIDIA nodes, as NVIDIA's DRA driver and
`nvidia-ctk --dev-root` mean it) those nodes get `hostPath: <dev root>/dev/<name>` and keep their
container path `/dev/<name>`. The MIG capability nodes are fully specified, so the runtime never looks
for them on the host, and they get no host path.

Everything that depends on the device sits in the device's edits, none in the spec-wide edits: a
container may use one request of a claim (`resources.claims[].request`), and then gets only that
request's CDI devices, but the spec-wide edits of every spec it touches. Env from several CDI
devices lands in one namespace and the runtime keeps the last value, so gpudra sets no variable that
must list all of a container's devices: no `CUDA_VISIBLE_DEVICES` (visibility comes from the device
nodes alone, as in NVIDIA's own DRA driver, and a pod's own `CUDA_VISIBLE_DEVICES` is left alone;
MPS clients must not set it either). `NVIDIA_VISIBLE_DEVICES` is set per device so that a legacy
`nvidia-container-runtime` hook, where a node still runs one, is told at most the container's own
devices rather than an image default of `all`; the last value is enough for it to mount the driver
libraries, and every device's nodes come from this spec anyway.

Driver libraries: the claim spec carries none. gpudra composes with the NVIDIA Container Toolkit's
own CDI spec (kind `nvidia.com/gpu`, written by `nvidia-ctk cdi generate` or the GPU Operator):
`ToolkitSpecs.device_ids` names the toolkit device for the same GPU (or MIG device, or for a MIG
device created after the toolkit spec was generated, its parent GPU) and the plugin lists that ID
after its own. The runtime then applies the toolkit's common edits (libraries, binaries, ldcache
and symlink hooks, `NVIDIA_VISIBLE_DEVICES=void`, which wins because it comes later). Without a
toolkit spec the container gets device nodes only, and libraries come from a legacy NVIDIA runtime
if the node has one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gpudra.atomic_file import remove_leftovers, write_atomically
from gpudra.errors import ConfigError, GpudraError

log = logging.getLogger(__name__)

# Device names start with the claim UID, and a UUID may start with a digit: that needs 0.5.0, as does a
# device node's hostPath. Nothing here needs more (0.6.0 adds annotations and dots in the class, 0.7.0
# additionalGids and intelRdt), and a runtime rejects spec versions newer than the CDI library it was
# built with, so the lowest version that admits the content loads on the most runtimes.
CDI_VERSION = "0.5.0"
ANNOTATIONS_CDI_VERSION = "0.6.0"  # the first with annotations, written only when a spec has some
# On a device prepared with admin access (it shares its GPU with another claim by design): without
# it, a checkpoint rebuilt from the specs would see the GPU held twice.
ADMIN_ACCESS_ANNOTATION = "gpudra.io/admin-access"
CLAIM_CLASS = "claim"
TOOLKIT_KIND = "nvidia.com/gpu"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
HOST_DEV_ROOT = PurePosixPath("/")  # the nodes are at their container paths on the host: no hostPath

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _CdiModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class DeviceNode(_CdiModel):
    path: str  # in the container
    host_path: str | None = None  # CDI 0.5.0+; where the runtime finds the node, when not at `path`
    type: Literal["c"] | None = None
    major: int | None = None
    minor: int | None = None


class Mount(_CdiModel):
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()


class ContainerEdits(_CdiModel):
    env: tuple[str, ...] = ()  # "KEY=value"
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()


class CdiDevice(_CdiModel):
    name: str
    # CDI 0.6.0+. gpudra records here what it must know to rebuild its state from the spec alone.
    annotations: Mapping[str, str] = Field(default_factory=dict)
    container_edits: ContainerEdits

    @property
    def admin_access(self) -> bool:
        return self.annotations.get(ADMIN_ACCESS_ANNOTATION) == "true"


class CdiSpec(_CdiModel):
    """The subset of the CDI spec gpudra writes; field names serialise as the spec spells them."""

    cdi_version: str
    kind: str
    devices: tuple[CdiDevice, ...]
    container_edits: ContainerEdits = ContainerEdits()

    def device_names(self) -> tuple[str, ...]:
        return tuple(device.name for device in self.devices)

    def to_json(self) -> str:
        """The spec file's content: camelCase keys, empty fields left out. Not indented: only an
        unindented encoding runs the json module's C encoder (an indented one costs a prepare more CPU
        than building the spec)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_defaults=True)) + "\n"


@dataclass(frozen=True)
class MigAccess:
    """What a container needs to reach one MIG device besides its parent GPU's node.

    Minors come from `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access`, the
    `nvidia-caps` major from `/proc/devices` (it is assigned at module load).
    """

    parent_uuid: str
    caps_major: int
    gi_cap_minor: int
    ci_cap_minor: int


@dataclass(frozen=True)
class ClaimDevice:
    """One prepared device as the claim's CDI spec needs it."""

    name: str  # the DRA device name, e.g. "gpu-0"
    gpu_minor: int  # N of /dev/nvidiaN; for MIG the parent GPU's
    uuid: str  # "GPU-…", or "MIG-…" with `mig` set
    mig: MigAccess | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # sharing env, e.g. CUDA_MPS_PIPE_DIRECTORY
    mounts: tuple[Mount, ...] = ()  # sharing mounts, e.g. the MPS pipe and shm directories
    admin_access: bool = False


def visible_uuid(device: CdiDevice) -> str | None:
    """The GPU or MIG UUID a claim spec's device makes visible (its NVIDIA_VISIBLE_DEVICES)."""
    for item in device.container_edits.env:
        key, _, value = item.partition("=")
        if key == "NVIDIA_VISIBLE_DEVICES":
            return value
    return None


def claim_kind(driver: str) -> str:
    """`<driver>/claim`, the kind of every claim spec of `driver`."""
    _check_vendor(driver)
    return f"{driver}/{CLAIM_CLASS}"


def device_name(device: str, share_id: str | None) -> str:
    """A claim's CDI device name after its UID: the device, and the share's ID for a share (a claim may
    hold two shares of one device, through two requests)."""
    return device if share_id is None else f"{device}-{share_id}"


_SHARE_SUFFIX = re.compile(r"-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


def split_device_name(name: str) -> tuple[str, str | None]:
    """A CDI device name after the claim UID, split into the device and the share's ID (or None)."""
    match = _SHARE_SUFFIX.search(name)
    return (name[: match.start()], match.group(1)) if match else (name, None)


def claim_device_id(*, driver: str, claim_uid: str, device_name: str) -> str:
    """The qualified CDI device ID the plugin returns for one device of a claim."""
    _check_device_name(claim_uid, field="claim_uid")
    _check_device_name(device_name, field="device_name")
    return f"{claim_kind(driver)}={claim_uid}-{device_name}"


def build_claim_spec(
    *, driver: str, claim_uid: str, devices: Sequence[ClaimDevice], dev_root: PurePath = HOST_DEV_ROOT
) -> CdiSpec:
    """The CDI spec of one claim. Pure.

    `dev_root` is the host directory whose `dev/` holds the NVIDIA device nodes; other than `/`, the
    nodes the runtime looks up on the host get `hostPath: <dev_root>/dev/<name>` (see the module doc)."""
    kind = claim_kind(driver)
    _check_device_name(claim_uid, field="claim_uid")
    if not dev_root.is_absolute():
        raise ConfigError(f"{str(dev_root)!r} is not an absolute path", field="dev_root")
    if not devices:
        raise ConfigError("a claim spec needs at least one device", field="devices")
    names = [device.name for device in devices]
    for index, device in enumerate(devices):
        _check_claim_device(device, field=f"devices[{index}]")
        if device.name in names[:index]:
            raise ConfigError(f"device {device.name!r} is listed twice", field=f"devices[{index}].name")
    cdi_devices = tuple(
        CdiDevice(
            name=f"{claim_uid}-{device.name}",
            annotations={ADMIN_ACCESS_ANNOTATION: "true"} if device.admin_access else {},
            container_edits=_device_edits(device, dev_root),
        )
        for device in devices
    )
    return CdiSpec(
        cdi_version=ANNOTATIONS_CDI_VERSION if any(d.annotations for d in cdi_devices) else CDI_VERSION,
        kind=kind,
        devices=cdi_devices,
        container_edits=ContainerEdits(
            device_nodes=tuple(_host_node(path, dev_root) for path in CONTROL_NODES)
        ),
    )


def _host_node(path: str, dev_root: PurePath) -> DeviceNode:
    """A node the runtime stats on the host: at `<dev_root><path>`, named in the spec only off `/`."""
    if dev_root == HOST_DEV_ROOT:
        return DeviceNode(path=path)
    return DeviceNode(path=path, host_path=str(dev_root.joinpath(path.lstrip("/"))))


def spec_path(cdi_root: Path, *, driver: str, claim_uid: str) -> Path:
    """Where the claim's spec lives: `<cdi_root>/<driver>-claim_<claim_uid>.json`."""
    _check_vendor(driver)
    _check_device_name(claim_uid, field="claim_uid")
    return cdi_root / f"{driver}-{CLAIM_CLASS}_{claim_uid}.json"


def write_spec(cdi_root: Path, spec: CdiSpec, *, claim_uid: str) -> Path:
    """Write (or replace) the claim's spec atomically, creating `cdi_root` if needed; return its path.

    A file-system error (a full disk, a read-only CDI root) raises GpudraError naming the spec, the
    CDI root and the cause: the kubelet shows it in the pod's events, so it must say what to fix."""
    driver = spec.kind.partition("/")[0]
    path = spec_path(cdi_root, driver=driver, claim_uid=claim_uid)
    try:
        cdi_root.mkdir(parents=True, exist_ok=True)
        # Runtimes run as root, but `nvidia-ctk cdi list` and other readers need not. Not synced: a spec
        # needs no power-cut durability. A power cut is a reboot, after which the (synced) checkpoint
        # discards every claim of the previous boot with its spec, and a spec no claim names is deleted.
        write_atomically(path, spec.to_json().encode(), mode=0o644, durable=False)
    except OSError as err:
        raise _file_error("write", path, cdi_root, err) from err
    return path


def delete_spec(cdi_root: Path, *, driver: str, claim_uid: str) -> bool:
    """Remove the claim's spec (and temp files a crash left from writing it); False when there was none.

    Raises GpudraError, as `write_spec` does, when the spec exists and cannot be removed."""
    path = spec_path(cdi_root, driver=driver, claim_uid=claim_uid)
    try:
        remove_leftovers(path)
        path.unlink()  # not synced either: see write_spec
    except FileNotFoundError:
        return False
    except OSError as err:
        # A read-only mount refuses unlink (EROFS) even of a name that does not exist. Nothing to
        # delete is success: a prepare rolled back on a read-only root must not keep its claim.
        if not os.path.lexists(path):
            return False
        raise _file_error("delete", path, cdi_root, err) from err
    return True


def remove_spec_leftovers(cdi_root: Path, *, driver: str) -> None:
    """Remove the temp files of this driver's claim specs that a crash inside a write left behind, of
    specs that may never have been renamed into place (no later write or delete of them cleans up)."""
    _check_vendor(driver)
    prefix = f".{driver}-{CLAIM_CLASS}_"
    try:
        with os.scandir(cdi_root) as entries:
            leftovers = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except FileNotFoundError:
        return
    for leftover in leftovers:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)


def _file_error(action: str, path: Path, cdi_root: Path, err: OSError) -> GpudraError:
    return GpudraError(
        f"cannot {action} the CDI spec {path.name} in the CDI root {cdi_root}: {err.strerror or err} "
        "(the CDI root must be a writable directory with free space)"
    )


# A claim spec of 8 GPUs with every MIG partition of each is a few KiB; anything this big is not gpudra's.
MAX_SPEC_BYTES = 1024 * 1024


def read_spec(path: Path) -> CdiSpec:
    """A claim spec gpudra wrote; GpudraError when it cannot be read or is not one.

    The rebuild after a lost checkpoint holds GPUs for the claims these specs name, so only a spec this
    process's user could have written is read: a regular file (not followed through a symlink) owned by
    it, writable by no one else, of a bounded size. A spec planted by another user (a CDI directory
    shared with something else) is refused with the reason."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise GpudraError(f"CDI spec {path} cannot be read: {err.strerror or err}") from err
    try:
        problem = _not_ours(os.fstat(fd))
        if problem:
            raise GpudraError(f"CDI spec {path} is not one gpudra wrote: {problem}")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SPEC_BYTES and (chunk := os.read(fd, MAX_SPEC_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        return CdiSpec.model_validate_json(b"".join(chunks))
    except (OSError, ValidationError) as err:
        raise GpudraError(f"CDI spec {path} cannot be read: {err}") from err
    finally:
        os.close(fd)


def _not_ours(found: os.stat_result) -> str | None:
    if not stat.S_ISREG(found.st_mode):
        return "not a regular file"
    if found.st_uid != os.geteuid():
        return f"owned by uid {found.st_uid}, not {os.geteuid()}"
    if found.st_mode & 0o022:
        return f"mode {stat.S_IMODE(found.st_mode):04o}: writable by others"
    if found.st_size > MAX_SPEC_BYTES:
        return f"{found.st_size} bytes, more than {MAX_SPEC_BYTES}"
    return None


def list_claim_specs(cdi_root: Path, *, driver: str) -> dict[str, Path]:
    """Claim UID -> spec file, for every claim spec of `driver` in `cdi_root` (leftovers after a crash)."""
    _check_vendor(driver)
    prefix = f"{driver}-{CLAIM_CLASS}_"
    try:
        entries = list(os.scandir(cdi_root))
    except FileNotFoundError:
        return {}
    specs: dict[str, Path] = {}
    for entry in entries:
        if not (
            entry.name.startswith(prefix)
            and entry.name.endswith(".json")
            and entry.is_file(follow_symlinks=False)
        ):
            continue
        claim_uid = entry.name[len(prefix) : -len(".json")]
        if _DEVICE_NAME.fullmatch(claim_uid):
            specs[claim_uid] = Path(entry.path)
    return specs


class ToolkitSpecs:
    """The device names of the NVIDIA Container Toolkit's specs (kind `nvidia.com/gpu`) in `cdi_dirs`.

    Files are re-read only when their mtime, size or inode changes (`nvidia-ctk` rewrites the spec
    when the driver or the MIG layout changes). A file that cannot be read or parsed counts as
    offering no devices and is logged once per version of the file; the runtime would reject it too.
    """

    def __init__(self, cdi_dirs: Sequence[Path]) -> None:
        self._cdi_dirs = tuple(cdi_dirs)
        self._parsed: dict[Path, tuple[tuple[int, int, int], frozenset[str]]] = {}

    def device_ids(self, device: ClaimDevice) -> tuple[str, ...]:
        """The toolkit's qualified ID for `device` (its MIG UUID or GPU UUID, else the MIG parent), or ()."""
        names = self._device_names()
        candidates = (device.uuid,) if device.mig is None else (device.uuid, device.mig.parent_uuid)
        return next(((f"{TOOLKIT_KIND}={uuid}",) for uuid in candidates if uuid in names), ())

    def _device_names(self) -> frozenset[str]:
        parsed: dict[Path, tuple[tuple[int, int, int], frozenset[str]]] = {}
        for directory in self._cdi_dirs:
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if not entry.name.endswith((".json", ".yaml")):
                    continue
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                path = Path(entry.path)
                version = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                known = self._parsed.get(path)
                parsed[path] = known if known and known[0] == version else (version, _toolkit_names(path))
        self._parsed = parsed
        return frozenset().union(*(names for _, names in parsed.values()))


def _toolkit_names(path: Path) -> frozenset[str]:
    try:
        text = path.read_text()
        document: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: bad JSON or encoding
        log.warning("ignoring CDI spec %s: %s", path, e)
        return frozenset()
    if not isinstance(document, dict) or document.get("kind") != TOOLKIT_KIND:
        return frozenset()
    devices = document.get("devices")
    if not isinstance(devices, list):
        return frozenset()
    # YAML reads an unquoted `name: 0` as an int; the CDI parser reads it as the string "0".
    return frozenset(
        str(device["name"])
        for device in devices
        if isinstance(device, dict) and isinstance(device.get("name"), str | int)
    )


def _device_edits(device: ClaimDevice, dev_root: PurePath) -> ContainerEdits:
    nodes = [_host_node(f"/dev/nvidia{device.gpu_minor}", dev_root)]
    if device.mig is not None:
        nodes += [
            DeviceNode(
                path=f"/dev/nvidia-caps/nvidia-cap{minor}", type="c", major=device.mig.caps_major, minor=minor
            )
            for minor in (device.mig.gi_cap_minor, device.mig.ci_cap_minor)
        ]
    return ContainerEdits(
        env=(
            f"NVIDIA_VISIBLE_DEVICES={device.uuid}",
            *(f"{key}={value}" for key, value in device.env.items()),
        ),
        device_nodes=tuple(nodes),
        mounts=device.mounts,
    )


def _check_claim_device(device: ClaimDevice, *, field: str) -> None:
    _check_device_name(device.name, field=f"{field}.name")
    if device.gpu_minor < 0:
        raise ConfigError(f"must be >= 0, got {device.gpu_minor}", field=f"{field}.gpu_minor")
    prefix = "GPU-" if device.mig is None else "MIG-"
    if not device.uuid.startswith(prefix) or len(device.uuid) == len(prefix) or "," in device.uuid:
        kind = "a full GPU" if device.mig is None else "a MIG device"
        raise ConfigError(f"{device.uuid!r} is not the UUID of {kind} ({prefix}…)", field=f"{field}.uuid")
    for key in device.env:
        if not _ENV_NAME.fullmatch(key) or key == "NVIDIA_VISIBLE_DEVICES":
            raise ConfigError(
                f"{key!r} is not allowed: names match [A-Za-z_][A-Za-z0-9_]*, "
                "and gpudra sets NVIDIA_VISIBLE_DEVICES itself",
                field=f"{field}.env",
            )
    for index, mount in enumerate(device.mounts):
        if not (mount.host_path.startswith("/") and mount.container_path.startswith("/")):
            raise ConfigError("host and container paths must be absolute", field=f"{field}.mounts[{index}]")


def _check_vendor(driver: str) -> None:
    if not _VENDOR_OR_CLASS.fullmatch(driver):
        raise ConfigError(
            f"{driver!r} cannot be a CDI vendor: use letters, digits, '.', '_' and '-', "
            "starting with a letter and ending with a letter or digit",
            field="driver",
        )


def _check_device_name(name: str, *, field: str) -> None:
    if not _DEVICE_NAME.fullmatch(name):
        raise ConfigError(
            f"{name!r} cannot be part of a CDI device name: use letters, digits, '.', '_', ':' and '-', "
            "starting and ending with a letter or digit",
            field=field,
        )
