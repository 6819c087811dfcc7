"""Generates the Python gRPC stubs in src/gpudra/_proto from the kubelet API protos under proto/.

I/O: reads proto/, runs `python -m grpc_tools.protoc` in a subprocess, writes the stubs into --out.

Each proto is staged as gpudra/_proto/<module>.proto before protoc sees it, so protoc itself names the
modules gpudra._proto.<module>_pb2 and the gRPC stubs import them by that path: no import rewriting.
The staged name only changes the descriptor's file name; package, service, message and field names and
numbers (all the kubelet sees on the wire) come from the proto unchanged.

Usage: python scripts/gen_proto.py [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
DEFAULT_OUT = REPO / "src" / "gpudra" / "_proto"
PACKAGE_DIR = Path("gpudra", "_proto")

# Source proto (relative to proto/) -> module stem inside gpudra._proto.
MODULES: dict[str, str] = {
    "k8s.io/kubelet/pkg/apis/dra/v1/api.proto": "dra_v1",
    "k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto": "dra_v1beta1",
    "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto": "pluginregistration_v1",
    "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto": "dra_health_v1alpha1",
}

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def protoc_command(staged: list[str], built: Path) -> list[str]:
    """The protoc invocation, run from the staging root with the staged proto paths."""
    return [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "--proto_path=.",
        f"--python_out={built}",
        f"--pyi_out={built}",
        f"--grpc_python_out={built}",
        *staged,
    ]


def generate(out: Path) -> list[Path]:
    """Regenerates every stub into `out`, dropping generated files no proto produces any more."""
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp, "staging")
        built = Path(tmp, "built")
        (staging / PACKAGE_DIR).mkdir(parents=True)
        built.mkdir()
        staged = []
        for source, module in sorted(MODULES.items(), key=lambda item: item[1]):
            target = PACKAGE_DIR / f"{module}.proto"
            shutil.copyfile(PROTO_ROOT / source, staging / target)
            staged.append(target.as_posix())
        result = subprocess.run(
            protoc_command(staged, built), cwd=staging, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise SystemExit(f"grpc_tools.protoc failed ({result.returncode}):\n{result.stderr}")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.iterdir():
            if old.name.endswith(GENERATED_SUFFIXES):
                old.unlink()
        written = []
        for produced in sorted((built / PACKAGE_DIR).iterdir()):
            shutil.copyfile(produced, out / produced.name)
            written.append(out / produced.name)
        return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory ({DEFAULT_OUT})")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    main()
