"""A real OCI registry on loopback for the e2e path a user takes: `make publish` pushes the release to it,
the nodes' containerd pull the image from it and Helm installs the chart from it (oci://).

I/O: one process, Debian's `docker-registry` (the distribution registry, installed by `make e2e`),
serving plain HTTP on 127.0.0.1 with its storage under a directory of the test's. Plain HTTP on
loopback only: nothing leaves the machine, and containerd is told so per host (containerd.py's
hosts.toml), as Helm and buildah are by their --plain-http / --tls-verify=false.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from gpudra.errors import ClusterError
from tests.localcluster.cluster import free_port

REGISTRY_BINARY = Path("/usr/bin/docker-registry")
START_TIMEOUT_SECONDS = 30


_MANIFESTS = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


class LoopbackRegistry:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> LoopbackRegistry:
        if not REGISTRY_BINARY.exists():
            raise ClusterError(
                f"{REGISTRY_BINARY} is missing: install Debian's docker-registry (make e2e does)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "config.yml"
        # JSON is YAML: the registry's configuration, storage and address ours.
        config.write_text(
            json.dumps(
                {
                    "version": 0.1,
                    "log": {"level": "warn"},
                    "storage": {"filesystem": {"rootdirectory": str(self.directory / "storage")}},
                    "http": {"addr": self.address},
                }
            )
        )
        log = (self.directory / "registry.log").open("wb")
        with log:
            self._process = subprocess.Popen(
                [str(REGISTRY_BINARY), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ClusterError(
                    f"docker-registry exited {self._process.returncode}: "
                    f"{(self.directory / 'registry.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise ClusterError(f"docker-registry did not answer on {self.address} in {START_TIMEOUT_SECONDS} s")

    def manifest(self, repository: str, reference: str) -> dict[str, object]:
        """The manifest (or index) the registry serves for repository:reference."""
        request = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{reference}",
            headers={"Accept": _MANIFESTS},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            document: dict[str, object] = json.load(reply)
        return document

    def tag(self, repository: str, reference: str, tag: str) -> None:
        """Give repository:reference's manifest (or index) a second tag, as `crane tag` would: the same
        bytes put under the new name, no blob copied."""
        request = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{reference}", headers={"Accept": _MANIFESTS}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            body, media_type = reply.read(), reply.headers["Content-Type"]
        put = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{tag}",
            data=body,
            method="PUT",
            headers={"Content-Type": media_type},
        )
        with urllib.request.urlopen(put, timeout=10) as reply:
            assert reply.status == 201, reply.status

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> LoopbackRegistry:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
