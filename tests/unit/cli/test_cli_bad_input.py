"""Every command, fed bad input, ends in one line naming what is wrong (and what is allowed) and a
documented exit code (gpudra.cli.EXIT_CODES), never a traceback. Each case runs `python -m gpudra` as a
user would, in a subprocess: the daemons' options (`kubelet-plugin`, `controller`) are refused before
anything starts, from a flag or from their GPUDRA_* variable alike."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpudra import cli

NVIDIA_CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: old, namespace: ml}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
"""
GOOD_CLAIM = NVIDIA_CLAIM.replace("gpu.nvidia.com", "gpu.gpudra.io")
UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
FILES = {
    "claim.yaml": GOOD_CLAIM,
    "nvidia.yaml": NVIDIA_CLAIM,
    "broken.yaml": "apiVersion: v1\nkind: [\n",
    "empty.yaml": "",
    "binary.yaml": "\udcff",  # written as bytes below
    "slices.yaml": "apiVersion: v1\nkind: List\nitems: []\n",
    "kubeconfig-broken": "garbage: [\n",
    "deployment-list-metadata.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: [1]\n"
    "spec: {template: {spec: {containers: []}}}\n",
    "pod-string-claim.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
    "spec: {containers: [], resourceClaims: [x]}\n",
    "kubeconfig-list": "- a\n- b\n",
    "kubeconfig-shape": "apiVersion: v1\nkind: Config\nclusters: 5\n",
    "kubeconfig-no-context": "apiVersion: v1\nkind: Config\n",
    "kubeconfig-unreachable": UNREACHABLE,
    "kubeconfig-no-ca": UNREACHABLE.replace(
        'server: "https://127.0.0.1:1"',
        'server: "https://127.0.0.1:1", certificate-authority: /nonexistent/ca.crt',
    ),
    "nomanifests/README": "x",
    "dp-strategy.yaml": "version: v1\nflags: {migStrategy: double}\n",
    "dp-field.yaml": "version: v1\nsharing: {timeslicing: {}}\n",
    "dp-replicas.yaml": "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: many}]\n",
    "dp-two.yaml": "version: v1\n---\nversion: v1\n",
    "dp-configmap.yaml": "apiVersion: v1\nkind: ConfigMap\ndata: {a: 'version: v1', b: 'version: v1'}\n",
}


@dataclass(frozen=True)
class Case:
    args: list[str]
    code: int
    says: str  # in the one line on stderr (code 2), or in stdout (code 1: validate's problems)
    env: dict[str, str] = field(default_factory=dict)
    # a daemon that fails while starting has logged its first steps: its error is the last line
    logs: bool = False


def _starting(command: str, *args: str) -> list[str]:
    """A daemon's command line that gets as far as its start: a simulated machine, the kubelet's
    directories under the test's own ({dir}, and {port}: a port another socket holds)."""
    if command == "kubelet-plugin":
        where = f"{{dir}}/plugin-{next(_PLUGINS)}"  # each its own sockets
        return [
            command,
            "--node-name=n",
            "--nvml=sim:dgx-h100",
            f"--plugin-dir={where}/plugin",
            f"--registry-dir={where}/registry",
            f"--cdi-root={where}/cdi",
            *args,
        ]
    if command == "controller":
        return [command, "--kubeconfig=kubeconfig-unreachable", "--webhook-port=0", "--metrics-port=0", *args]
    return [command, "--nvml=sim:dgx-h100", *args]


_PLUGINS = itertools.count()
SIM = {"GPUDRA_SIM_STATE": "{dir}/sim.json"}


USAGE, NO = 2, 1
COMMANDS = (
    "inventory",
    "validate",
    "migrate",
    "explain",
    "status",
    "kubelet-plugin",
    "controller",
    "mps-host",
)
CASES = {
    # the gpudra command
    "no command": Case([], USAGE, "the following arguments are required: COMMAND"),
    "unknown command": Case(["bogus"], USAGE, "invalid choice: 'bogus'"),
    "unknown option": Case(["inventory", "--bogus"], USAGE, "unrecognized arguments: --bogus"),
    # inventory
    "inventory: unknown machine": Case(
        ["inventory", "--nvml=sim:dgx-h200"], USAGE, "--nvml: 'sim:dgx-h200' is not one of real, sim:dgx-a100"
    ),
    "inventory: output": Case(
        ["inventory", "--nvml=sim:dgx-h100", "-o", "xml"],
        USAGE,
        "'xml' is not one of table, wide, json, yaml",
    ),
    "inventory: old release": Case(
        ["inventory", "--server-minor=30"], USAGE, "--server-minor: 1.30 is older than 1.34"
    ),
    "inventory: release word": Case(
        ["inventory", "--server-minor=latest"], USAGE, "'latest' is not a Kubernetes 1.x minor >= 34"
    ),
    "inventory: feature gate": Case(
        ["inventory", "--feature-gates=DRAX"], USAGE, "--feature-gates: 'DRAX' is not Gate=true or Gate=false"
    ),
    "inventory: MIG mode": Case(
        ["inventory", "--mig-mode=dynamic"], USAGE, "'dynamic' is not one of partitionable, static"
    ),
    "inventory: profiles without partitions": Case(
        ["inventory", "--nvml=sim:dgx-a100", "--mig-profiles=1g.5gb"],
        USAGE,
        "--mig-profiles: names MIG profiles to offer on demand, which needs --mig-mode partitionable",
    ),
    "inventory: profile syntax": Case(
        ["inventory", "--mig-profiles=big one"], USAGE, "is not comma-separated MIG profile names"
    ),
    "inventory: shares": Case(["inventory", "--shares=yes"], USAGE, "'yes' is not one of off, on"),
    "inventory: driver name": Case(
        ["inventory", "--driver-name=GPU_Driver"], USAGE, "'GPU_Driver' is not a DNS subdomain"
    ),
    "inventory: environment": Case(
        ["inventory"], USAGE, "--nvml: 'sim:nope' is not one of", env={"GPUDRA_NVML": "sim:nope"}
    ),
    # validate
    "validate: no path": Case(["validate"], USAGE, "the following arguments are required: PATH"),
    "validate: missing file": Case(["validate", "missing.yaml"], USAGE, "missing.yaml: cannot be read"),
    "validate: directory without manifests": Case(
        ["validate", "nomanifests"], USAGE, "is a directory holding no .yaml, .yml, .json file"
    ),
    "validate: a device": Case(["validate", "/dev/null"], USAGE, "/dev/null: is not a regular file"),
    "validate: bad YAML": Case(["validate", "broken.yaml"], NO, "broken.yaml: is not valid YAML"),
    "validate: not text": Case(["validate", "binary.yaml"], NO, "is not YAML or JSON: not UTF-8 text"),
    "validate: empty file": Case(["validate", "empty.yaml"], NO, "holds no Kubernetes object"),
    "validate: NVIDIA class": Case(
        ["validate", "nvidia.yaml"], NO, "gpu.nvidia.com is NVIDIA's DRA driver's name"
    ),
    "validate: driver name": Case(
        ["validate", "claim.yaml", "--driver-name=a/b"], USAGE, "'a/b' is not a DNS"
    ),
    # migrate
    "migrate: no file": Case(["migrate"], USAGE, "the following arguments are required: FILE"),
    "migrate: missing file": Case(["migrate", "missing.yaml"], USAGE, "missing.yaml: cannot be read"),
    "migrate: a directory": Case(
        ["migrate", "nomanifests"], USAGE, "nomanifests: is a directory, not a file"
    ),
    "migrate: a device": Case(["migrate", "/dev/null"], USAGE, "/dev/null: is not a regular file"),
    "migrate: bad YAML": Case(["migrate", "broken.yaml"], USAGE, "broken.yaml: is not valid YAML"),
    "migrate: not text": Case(["migrate", "binary.yaml"], USAGE, "is not YAML or JSON: not UTF-8 text"),
    "migrate: missing config": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "gone.yaml"],
        USAGE,
        "--device-plugin-config: gone.yaml: cannot be read",
    ),
    "migrate: config not YAML": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "broken.yaml"],
        USAGE,
        "broken.yaml: is not valid YAML",
    ),
    "migrate: config strategy": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "dp-strategy.yaml"],
        USAGE,
        "flags.migStrategy: 'double' is not one of none, single, mixed",
    ),
    "migrate: config field": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "dp-field.yaml"],
        USAGE,
        "sharing.timeslicing: is not a field here; the fields are: timeSlicing, mps",
    ),
    "migrate: config replicas": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "dp-replicas.yaml"],
        USAGE,
        "sharing.mps.resources[0].replicas: 'many' is not a whole number >= 1",
    ),
    "migrate: config documents": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "dp-two.yaml"], USAGE, "holds 2 documents"
    ),
    "migrate: config map entries": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "dp-configmap.yaml"], USAGE, "must hold one entry"
    ),
    "migrate: config empty": Case(
        ["migrate", "claim.yaml", "--device-plugin-config", "empty.yaml"], USAGE, "holds 0 documents"
    ),
    "migrate: MIG strategy": Case(
        ["migrate", "claim.yaml", "--mig-strategy=double"],
        USAGE,
        "'double' is not one of none, single, mixed",
    ),
    "migrate: GPU memory": Case(
        ["migrate", "claim.yaml", "--gpu-memory=lots"],
        USAGE,
        "--gpu-memory: 'lots' is not an amount of memory",
    ),
    "migrate: GPU memory too small": Case(
        ["migrate", "claim.yaml", "--gpu-memory=512Mi"], USAGE, "'512Mi' is less than 1Gi"
    ),
    "migrate: driver name": Case(["migrate", "claim.yaml", "--driver-name=a/b"], USAGE, "'a/b' is not a DNS"),
    # explain
    "explain: no target": Case(["explain"], USAGE, "the following arguments are required: target"),
    "explain: a directory": Case(
        ["explain", "nomanifests", "--slices", "slices.yaml"],
        USAGE,
        "nomanifests: is a directory, not a file",
    ),
    "explain: missing file": Case(
        ["explain", "missing.yaml", "--slices", "slices.yaml"], USAGE, "missing.yaml: cannot be read"
    ),
    "explain: missing slices": Case(
        ["explain", "claim.yaml", "--slices", "gone.yaml"], USAGE, "gone.yaml: cannot be read"
    ),
    "explain: bad slices": Case(
        ["explain", "claim.yaml", "--slices", "broken.yaml"], USAGE, "broken.yaml: is not valid YAML"
    ),
    "explain: missing classes": Case(
        ["explain", "claim.yaml", "--slices", "slices.yaml", "--classes", "gone.yaml"],
        USAGE,
        "--classes: gone.yaml does not exist",
    ),
    "explain: nothing to explain": Case(
        ["explain", "slices.yaml", "--slices", "slices.yaml"], USAGE, "holds no ResourceClaim"
    ),
    "explain: output": Case(["explain", "claim.yaml", "-o", "xml"], USAGE, "'xml' is not one of"),
    "explain: a kind it does not read": Case(
        ["explain", "service/web", "--slices", "slices.yaml"],
        USAGE,
        "service/web: is neither a file nor KIND/NAME of a kind explain reads (claim, pod, deployment,",
    ),
    "explain: a workload whose metadata is a list": Case(
        ["explain", "deployment-list-metadata.yaml", "--slices", "slices.yaml"],
        USAGE,
        "Deployment: metadata: is list, not an object",
    ),
    "explain: a pod claim that is a string": Case(
        ["explain", "pod-string-claim.yaml", "--slices", "slices.yaml"],
        USAGE,
        "Pod default/p: spec.resourceClaims[0]: is str, not an object",
    ),
    "explain: a workload offline": Case(
        ["explain", "deploy/web", "--slices", "slices.yaml"], USAGE, "deploy/web names an object in a cluster"
    ),
    "explain: old release": Case(
        ["explain", "claim.yaml", "--server-minor=33"], USAGE, "1.33 is older than 1.34"
    ),
    "explain: malformed kubeconfig": Case(
        ["explain", "claim/x", "--kubeconfig", "kubeconfig-broken"], USAGE, "is not valid YAML"
    ),
    "explain: missing kubeconfig": Case(
        ["explain", "claim/x", "--kubeconfig", "gone"], USAGE, "kubeconfig gone: is not a file"
    ),
    "explain: unreachable cluster": Case(
        ["explain", "claim/x", "--kubeconfig", "kubeconfig-unreachable"], USAGE, "cannot reach the API server"
    ),
    # status
    "status: malformed kubeconfig": Case(
        ["status", "--kubeconfig", "kubeconfig-broken"], USAGE, "kubeconfig-broken: is not valid YAML"
    ),
    "status: kubeconfig a list": Case(
        ["status", "--kubeconfig", "kubeconfig-list"], USAGE, "kubeconfig-list: is not a kubeconfig"
    ),
    "status: kubeconfig shape": Case(
        ["status", "--kubeconfig", "kubeconfig-shape"], USAGE, "kubeconfig-shape: is not a kubeconfig"
    ),
    "status: kubeconfig without context": Case(
        ["status", "--kubeconfig", "kubeconfig-no-context"], USAGE, "invalid cluster credentials"
    ),
    "status: output": Case(["status", "-o", "xml"], USAGE, "'xml' is not one of"),
    "status: idle seconds": Case(
        ["status", "--idle-after-seconds=-5"], USAGE, "'-5' is not a number of seconds >= 0"
    ),
    "status: controller URL": Case(
        ["status", "--controller-url=http://127.0.0.1:8080"], USAGE, "is not an https:// URL"
    ),
    "status: controller down": Case(
        ["status", "--controller-url=https://127.0.0.1:1", "--token=t"],
        USAGE,
        "reading https://127.0.0.1:1/status",
    ),
    # kubelet-plugin
    "plugin: no node name": Case(["kubelet-plugin"], USAGE, "--node-name: is required"),
    "plugin: log level": Case(
        ["kubelet-plugin", "--node-name=n", "--log-level=LOUD"],
        USAGE,
        "--log-level: 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR",
    ),
    "plugin: log level variable": Case(
        ["kubelet-plugin", "--node-name=n"],
        USAGE,
        "'verbose' is not one of DEBUG",
        {"GPUDRA_LOG_LEVEL": "verbose"},
    ),
    "plugin: log format": Case(
        ["kubelet-plugin", "--node-name=n", "--log-format=xml"], USAGE, "'xml' is not one of text, json"
    ),
    "plugin: resync word": Case(
        ["kubelet-plugin", "--node-name=n", "--resync-seconds=abc"],
        USAGE,
        "--resync-seconds: 'abc' is not a number of seconds > 0",
    ),
    "plugin: resync zero": Case(
        ["kubelet-plugin", "--node-name=n", "--resync-seconds=0"], USAGE, "'0' is not a number of seconds > 0"
    ),
    "plugin: port range": Case(
        ["kubelet-plugin", "--node-name=n", "--metrics-port=70000"],
        USAGE,
        "'70000' is not a port: 1 to 65535",
    ),
    "plugin: port word": Case(
        ["kubelet-plugin", "--node-name=n"], USAGE, "'http' is not a port", {"GPUDRA_METRICS_PORT": "http"}
    ),
    "plugin: XID class": Case(
        ["kubelet-plugin", "--node-name=n", "--health-xids=31=boom"], USAGE, "--health-xids: '31=boom' is not"
    ),
    "plugin: reset effect": Case(
        ["kubelet-plugin", "--node-name=n", "--health-reset-effect=Evict"],
        USAGE,
        "'Evict' is not one of NoSchedule, NoExecute",
    ),
    "plugin: instance ID": Case(
        ["kubelet-plugin", "--node-name=n", "--instance-id=../x"], USAGE, "'../x' is not an instance ID"
    ),
    "plugin: relative CDI root": Case(
        ["kubelet-plugin", "--node-name=n", "--cdi-root=cdi"],
        USAGE,
        "--cdi-root: 'cdi' is not an absolute path",
    ),
    "plugin: relative toolkit dirs": Case(
        ["kubelet-plugin", "--node-name=n", "--toolkit-cdi-dirs=etc/cdi"],
        USAGE,
        "is not ':'-separated absolute paths",
    ),
    "plugin: unknown machine variable": Case(
        ["kubelet-plugin", "--node-name=n"], USAGE, "--nvml: 'sim:dgx-h200'", {"GPUDRA_NVML": "sim:dgx-h200"}
    ),
    "plugin: interval": Case(
        ["kubelet-plugin", "--node-name=n", "--mps-check-interval-seconds=inf"],
        USAGE,
        "'inf' is not a number",
    ),
    # controller
    "controller: short lease": Case(
        ["controller", "--lease-seconds=1"], USAGE, "--lease-seconds: '1' is not a number of seconds >= 3"
    ),
    "controller: lease variable": Case(
        ["controller"], USAGE, "'abc' is not a number of seconds >= 3", {"GPUDRA_LEASE_SECONDS": "abc"}
    ),
    "controller: failure policy": Case(
        ["controller", "--failure-policy=Maybe"], USAGE, "'Maybe' is not one of Fail, Ignore"
    ),
    "controller: webhook port": Case(["controller", "--webhook-port=-1"], USAGE, "'-1' is not a port"),
    "controller: webhook URL": Case(
        ["controller", "--webhook-url=http://x"], USAGE, "'http://x' is not https://HOST:PORT"
    ),
    "controller: idle seconds": Case(
        ["controller", "--idle-after-seconds=nan"], USAGE, "'nan' is not a number"
    ),
    "controller: log level": Case(
        ["controller", "--log-level=verbose"], USAGE, "'verbose' is not one of DEBUG"
    ),
    # mps-host
    "mps-host: log level": Case(["mps-host", "--log-level=LOUD"], USAGE, "'LOUD' is not one of DEBUG"),
    "mps-host: relative socket": Case(
        ["mps-host", "--mps-host-socket=x.sock"], USAGE, "--mps-host-socket: 'x.sock' is not an absolute path"
    ),
    # the daemons' start: what they are given cannot be used
    "plugin: kubeconfig not YAML": Case(
        _starting("kubelet-plugin", "--kubeconfig=kubeconfig-broken"),
        USAGE,
        "kubeconfig kubeconfig-broken: is not valid YAML",
        SIM,
        logs=True,
    ),
    "plugin: kubeconfig a directory": Case(
        _starting("kubelet-plugin", "--kubeconfig=nomanifests"),
        USAGE,
        "kubeconfig nomanifests: is not a file",
        SIM,
        logs=True,
    ),
    "plugin: kubeconfig context missing": Case(
        _starting("kubelet-plugin", "--kubeconfig=kubeconfig-no-context"),
        USAGE,
        "kubeconfig kubeconfig-no-context: invalid cluster credentials",
        SIM,
        logs=True,
    ),
    "plugin: state dir cannot be made": Case(
        _starting(
            "kubelet-plugin", "--state-dir={dir}/claim.yaml/state", "--kubeconfig=kubeconfig-unreachable"
        ),
        USAGE,
        "claim.yaml/state: Not a directory",
        SIM,
        logs=True,
    ),
    "plugin: plugin dir cannot be made": Case(
        ["kubelet-plugin", "--node-name=n", "--nvml=sim:dgx-h100", "--plugin-dir={dir}/claim.yaml/p"],
        USAGE,
        "claim.yaml/p: Not a directory",
        SIM,
    ),
    "plugin: metrics port in use": Case(
        _starting(
            "kubelet-plugin",
            "--metrics-port={port}",
            "--metrics-address=127.0.0.1",
            "--kubeconfig=kubeconfig-unreachable",
        ),
        USAGE,
        "--metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use",
        SIM,
        logs=True,
    ),
    "controller: kubeconfig not YAML": Case(
        _starting("controller", "--kubeconfig=kubeconfig-broken"),
        USAGE,
        "kubeconfig kubeconfig-broken: is not valid YAML",
        logs=True,
    ),
    "controller: kubeconfig certificate missing": Case(
        _starting("controller", "--kubeconfig=kubeconfig-no-ca"),
        USAGE,
        "kubeconfig kubeconfig-no-ca: invalid cluster credentials: File does not exist: /nonexistent/ca.crt",
        logs=True,
    ),
    "controller: no kubeconfig outside a cluster": Case(
        ["controller", "--webhook-port=0", "--metrics-port=0"],
        USAGE,
        "in-cluster config (no --kubeconfig): invalid cluster credentials",
        logs=True,
    ),
    "controller: webhook port in use": Case(
        _starting("controller", "--webhook-port={port}", "--webhook-address=127.0.0.1"),
        USAGE,
        "--webhook-port: cannot listen on 127.0.0.1:{port}: Address already in use",
        logs=True,
    ),
    "controller: metrics port in use": Case(
        _starting("controller", "--metrics-port={port}", "--metrics-address=127.0.0.1"),
        USAGE,
        "--metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use",
        logs=True,
    ),
    "mps-host: state dir cannot be made": Case(
        _starting("mps-host", "--state-dir={dir}/claim.yaml/state"),
        USAGE,
        "claim.yaml/state/mps-host-tools: Not a directory",
        SIM,
        logs=True,
    ),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-input")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"\xff\xfe" if name == "binary.yaml" else text.encode())
    return root


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port a listening socket holds, for the daemons' "in use"."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUDRA_", "KUBERNETES_SERVICE_")) and k != "KUBECONFIG"
    }
    return subprocess.run(
        [sys.executable, "-m", "gpudra", *args],
        cwd=cwd,
        env={**clean, "HOME": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_table_covers_every_command() -> None:
    assert len(CASES) >= 40
    assert {c.args[0] for c in CASES.values() if c.args} >= set(COMMANDS)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_and_an_exit_code(case: Case, workdir: Path, busy_port: int) -> None:
    def filled(text: str) -> str:
        return text.replace("{dir}", str(workdir)).replace("{port}", str(busy_port))

    done = run([filled(a) for a in case.args], workdir, {k: filled(v) for k, v in case.env.items()})
    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == case.code, done.stderr
    if case.code == USAGE:
        line = done.stderr.splitlines()[-1] if case.logs else done.stderr.rstrip("\n")
        assert "\n" not in line, done.stderr
        assert filled(case.says) in line, done.stderr
        # argparse names the command, unless the top level refuses the line (no command, extra arguments)
        assert line.startswith((f"gpudra {case.args[0]}: " if case.args else "gpudra: ", "gpudra: "))
    else:
        assert case.says in done.stdout and done.stderr == ""


def test_output_closed_early_is_exit_141_and_silent(workdir: Path) -> None:
    """`gpudra inventory -o json | head`: the reader goes away, the rest is dropped quietly."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUDRA_")}
    # A machine of its own (the default state file is shared, and may hold GPUs in MIG mode that
    # publish nothing), and output well beyond a pipe's 64 KiB buffer, so that the write meets the
    # closed pipe.
    clean["GPUDRA_SIM_STATE"] = str(workdir / "machine.json")
    partitions = ["--mig-mode=partitionable", "--shares=on"]
    with subprocess.Popen(
        [sys.executable, "-m", "gpudra", "inventory", "--nvml=sim:dgx-h100", *partitions, "-o", "json"],
        cwd=workdir,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.read(10)
        process.stdout.close()
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=60) == cli.EXIT_PIPE_CLOSED
    assert stderr == ""


def test_the_exit_codes_are_in_every_commands_help(workdir: Path) -> None:
    for command in COMMANDS:
        done = run([command, "--help"], workdir, {})
        assert done.returncode == 0 and cli.EXIT_CODES.splitlines()[1].strip() in done.stdout


def test_a_daemons_unexpected_error_is_one_line_and_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A bug met while a daemon starts (here: mps-host's run raising what nothing expects) is the same
    one line as in the other commands; the traceback only with GPUDRA_DEBUG=1."""
    from gpudra.node import mps_host  # noqa: PLC0415 (what the command imports when it runs)

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(mps_host, "run", broken)
    monkeypatch.delenv("GPUDRA_DEBUG", raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    argv = ["mps-host", "--nvml=sim:dgx-h100", f"--state-dir={tmp_path}", "--log-level=ERROR"]
    try:
        assert cli.main(argv) == cli.EXIT_BUG
        err = capsys.readouterr().err
        assert err == (
            "gpudra mps-host: unexpected error (a bug: please report it; GPUDRA_DEBUG=1 shows the "
            "traceback): RuntimeError: boom\n"
        )
        monkeypatch.setenv("GPUDRA_DEBUG", "1")
        with pytest.raises(RuntimeError, match="boom"):
            cli.main(argv)
    finally:  # the daemon's own SIGTERM and SIGINT handlers, not pytest's
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
