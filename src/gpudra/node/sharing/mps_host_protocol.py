"""What the plugin and `gpudra mps-host` say to each other over mps-host's unix socket. Pure but for the
bounded reads and writes of one message on a connected socket.

One request per connection, one reply: a JSON object on one line, at most `MAX_MESSAGE_BYTES`. Both
ends are gpudra (root on the node, the peer checked by SO_PEERCRED), so a message that does not decode
is a bug or a stranger: it is refused with one line naming what was wrong, never a traceback.

The operations are `MpsDaemons`'s three (`gpudra.node.sharing.mps_daemons`): `running`, `start` (which
adopts a daemon that runs) and `stop`, each naming the daemon as the claim's checkpoint records do (its
directory and its token). A reply carries the daemon's process (pid and start time) where there is one,
what a tenant changed in the daemon's pipe directory (for the plugin's metrics and Node events), how
many commands went through the shared pipe directory (for the plugin's metric), and the error of a
failed operation.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpudra.node.sharing.mps_daemons import TamperingKind

MAX_MESSAGE_BYTES: Final = 64 * 1024  # a start names a few GPUs and limits: far below this


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DaemonRef(_Message):
    root: Path
    token: str | None = Field(max_length=64)


class Running(_Message):
    op: Literal["running"] = "running"
    daemon: DaemonRef


class Start(_Message):
    op: Literal["start"] = "start"
    daemon: DaemonRef
    visible: list[Annotated[str, Field(max_length=128)]] = Field(max_length=64)
    active_thread_percentage: int | None = Field(ge=1, le=100)
    pinned_memory_limits: dict[Annotated[str, Field(max_length=128)], Annotated[int, Field(gt=0)]] = Field(
        max_length=64
    )


class Stop(_Message):
    op: Literal["stop"] = "stop"
    daemon: DaemonRef


class HostRequest(_Message):
    request: Annotated[Running | Start | Stop, Field(discriminator="op")]


class ProcessRef(_Message):
    pid: int
    start_time: int
    parent: int


class TamperingReport(_Message):
    kind: TamperingKind
    root: Path
    detail: str


class HostReply(_Message):
    process: ProcessRef | None = None
    tampering: list[TamperingReport] = []
    # Commands the operation sent through the daemon's shared pipe directory (mps_daemons: on_shared_pipe).
    shared_pipe_commands: int = Field(default=0, ge=0)
    error: str | None = None  # the operation failed (a HardwareError's message)


M = TypeVar("M", "HostRequest", "HostReply")


class ProtocolError(Exception):
    """A message that is not one: too long, cut off, or not this protocol's JSON."""


def send(connection: socket.socket, message: HostRequest | HostReply) -> None:
    # A reply leaves out what is at its default (a request cannot: `op` is its discriminator), so that a
    # plugin older than mps-host (mps-host is replaced only when deleted; a plugin may be rolled back)
    # reads it, as long as the fields it does not know say nothing.
    text = message.model_dump_json(exclude_defaults=isinstance(message, HostReply))
    data = text.encode() + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a {len(data)}-byte message is over the {MAX_MESSAGE_BYTES} bytes allowed")
    connection.sendall(data)


def receive(connection: socket.socket, kind: type[M]) -> M:
    """One message of `kind` from `connection` (its timeout bounds the wait); ProtocolError otherwise."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = connection.recv(MAX_MESSAGE_BYTES + 1 - len(data))
        if not chunk:
            raise ProtocolError("the connection closed before a whole message came")
        data += chunk
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a message over the {MAX_MESSAGE_BYTES} bytes allowed")
    try:
        return kind.model_validate_json(bytes(data))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the message"
        raise ProtocolError(f"{where}: {first['msg']}") from err
