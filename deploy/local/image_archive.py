"""Writes a one-layer image holding one static binary as a docker-archive, for `ctr images import`.

Used by build-runtime.sh for the pause (sandbox) image: a docker-archive is a tarball of the layer,
the image config and a manifest.json whose RepoTags name the image, which ctr registers as they are.
The layer's file times are fixed, so the same binary gives the same image ID.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _layer(binary: Path, entrypoint: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = binary.read_bytes()
        info = tarfile.TarInfo(entrypoint.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_archive(binary: Path, *, entrypoint: str, name: str, out: Path) -> str:
    layer = _layer(binary, entrypoint)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [entrypoint], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(out, mode="w") as tar:
        for member, data in (("layer.tar", layer), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return config_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--entrypoint", required=True)
    parser.add_argument("--name", required=True, help="the image reference, e.g. localhost/pause:v1.36.3")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = write_archive(args.binary, entrypoint=args.entrypoint, name=args.name, out=args.out)
    print(f"{args.out}: {args.name} (config {config})")


if __name__ == "__main__":
    main()
