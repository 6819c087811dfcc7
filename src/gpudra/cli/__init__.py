"""The `gpudra` command: inventory, validate, migrate, explain, status, kubelet-plugin, mps-host,
controller: the parser and the dispatch to one module per command.

The daemons' options (kubelet-plugin, mps-host, controller) are declared once, as the fields of their
options objects (gpudra.node.options, gpudra.controller.options; gpudra.options.declared): the parser
is made from those declarations and the options object from what it parses. Each can also come from an
environment variable, GPUDRA_<OPTION> (e.g. GPUDRA_NODE_NAME), which is how the Helm chart sets them.
Each option's value type (`gpudra.options.types`) checks it, from a flag and from a variable alike, and
is the rule the chart's values.schema.json holds for it (scripts/gen_chart_schema.py).

No traceback reaches a user: bad input of any kind ends in one line and an exit code of EXIT_CODES.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from gpudra import build
from gpudra.cli.output_format import OUTPUT, OUTPUT_HELP
from gpudra.controller.options import ControllerOptions
from gpudra.errors import ConfigError, GpudraError
from gpudra.model.kube_api import NEWEST_MINOR, OLDEST_MINOR
from gpudra.model.publishing import Publishing, ServerFields, parse_feature_gates
from gpudra.node.options import MpsHostOptions, PluginOptions, nvml_option
from gpudra.options import declared
from gpudra.options.declared import group, option
from gpudra.options.shared import DRIVER, DRIVER_NAME, driver_option
from gpudra.options.types import Bytes, CheckedText, Choice, Minor, Pattern, Seconds, comma_list
from gpudra.runtime import logs

# Each command imports what it needs when it runs: `gpudra kubelet-plugin` opens the kubelet's sockets
# before the ~0.3 s of importing NVML, the API client and the models (see gpudra.node.daemon).

EXIT_CODES = """\
exit codes:
  0    success (validate: every file is valid; migrate: everything was translated; explain: every
       claim fits)
  1    the answer is no: validate found problems; migrate: something had no gpudra equivalent and was
       left as it was (listed on stderr; the output is incomplete); explain: a claim does not fit;
       inventory: a slice would be refused; kubelet-plugin, controller: stopped on an error while running
  2    usage or input error: a bad option or GPUDRA_* variable, a file that cannot be read or parsed,
       a kubeconfig that cannot be used, an API server or controller that cannot be reached or refuses
  3    an unexpected error inside gpudra (a bug: please report it; GPUDRA_DEBUG=1 shows the traceback)
  130  interrupted (Ctrl-C)
  141  the output was closed early (e.g. piped into head): the rest is not written
"""
EXIT_USAGE = 2
EXIT_BUG = 3
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141

_GATES = CheckedText(parse_feature_gates, comma_list(r"[A-Za-z0-9]+\s*=\s*([Tt]rue|[Ff]alse|TRUE|FALSE)"))


@dataclass(frozen=True, kw_only=True)
class InventoryOptions:
    """`gpudra inventory`'s options that say which node it is: the plugin's own."""

    nvml: str = nvml_option()
    driver: str = driver_option()
    publishing: Publishing = group(Publishing)
    node_name: str = option("node (and pool) name", default=lambda _: socket.gethostname())


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: the command, the option, what is allowed."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _command(commands: Any, name: str, help: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpudra",
        description="Kubernetes DRA driver for NVIDIA GPUs",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=build.describe())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inv = _command(commands, "inventory", "show the GPUs and the ResourceSlices gpudra would publish")
    declared.add_arguments(inv, InventoryOptions)
    inv.add_argument(
        "-o", "--output", type=OUTPUT, default="table", help=f"{OUTPUT_HELP}; json, yaml: the slices"
    )
    inv.add_argument(
        "--server-minor",
        type=Minor(OLDEST_MINOR),
        default=NEWEST_MINOR,
        help=f"Kubernetes 1.x minor to publish for: what its API server keeps, how slices are split "
        f"(default {NEWEST_MINOR})",
    )
    _feature_gates(inv, "the API server's")

    val = _command(commands, "validate", "check gpudra configs in ResourceClaims, templates, classes")
    val.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="a YAML or JSON file; a directory: its *.yaml, *.yml and *.json files (not subdirectories); "
        "- : standard input",
    )
    val.add_argument(
        "--driver-name", default=DRIVER, type=DRIVER_NAME, help="DRA driver name whose configs are checked"
    )
    val.add_argument(
        "-o", "--output", type=OUTPUT, default="table", help=f"{OUTPUT_HELP}; json, yaml: a List of problems"
    )

    _migrate_parser(
        _command(commands, "migrate", "rewrite NVIDIA DRA driver and device-plugin manifests for gpudra")
    )

    why = _command(commands, "explain", "why a claim fits a node or not, by the scheduler's rules")
    why.add_argument(
        "target",
        help="a file of claims, templates, pods or workloads; or, in the cluster, claim/NAME, pod/NAME, "
        "deployment/NAME, statefulset/NAME, replicaset/NAME, daemonset/NAME, job/NAME or cronjob/NAME "
        "(a workload: a new pod of its template)",
    )
    why.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace of KIND/NAME and of objects in the file that name none (default: the "
        "kubeconfig context's, else default)",
    )
    why.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    why.add_argument("--context", default=None, help="the kubeconfig context to use (default: its current)")
    why.add_argument(
        "--slices",
        action="append",
        type=Path,
        default=[],
        help="offline: ResourceSlices (gpudra inventory -o yaml) and allocated ResourceClaims, "
        "instead of the cluster's; repeatable",
    )
    why.add_argument("--classes", type=Path, default=None, help="DeviceClasses (offline default: gpudra's)")
    why.add_argument(
        "-o", "--output", type=OUTPUT, default="table", help=f"{OUTPUT_HELP}; wide: every device"
    )
    why.add_argument("-v", "--verbose", action="store_true", help="the same as -o wide")
    why.add_argument(
        "--server-minor",
        type=Minor(OLDEST_MINOR),
        default=None,
        help="the cluster's Kubernetes 1.x minor, for what its API server keeps (offline default "
        f"{NEWEST_MINOR}; online the server's, its fields found by a dry-run probe slice)",
    )
    _feature_gates(why, "the cluster's")
    why.add_argument(
        "--driver-name", default=DRIVER, type=DRIVER_NAME, help="DRA driver name whose forms are judged"
    )

    status = _command(
        commands, "status", "the cluster's GPUs: allocated, shared, free, idle; MIG room; claims waiting"
    )
    status.add_argument("-o", "--output", type=OUTPUT, default="table", help=OUTPUT_HELP)
    status.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    status.add_argument(
        "--context", default=None, help="the kubeconfig context to use (default: its current)"
    )
    status.add_argument("--driver-name", default=DRIVER, type=DRIVER_NAME, help="DRA driver name")
    status.add_argument(
        "--idle-after-seconds",
        default="1800",
        type=Seconds(),
        help="report an allocated GPU idle after this long without activity (as the controller's option)",
    )
    status.add_argument(
        "--controller-url",
        default=None,
        type=Pattern(r"https://\S+", "an https:// URL (e.g. https://127.0.0.1:9443)"),
        help="read the view the controller serves at this URL's /status, its webhook port "
        "(e.g. https://127.0.0.1:9443 through kubectl port-forward)",
    )
    status.add_argument(
        "--token",
        default=None,
        help="with --controller-url: the bearer token to send (default: the kubeconfig's)",
    )
    status.add_argument(
        "--certificate-authority",
        default=None,
        help="with --controller-url: the CA file that signed the controller's certificate (the "
        "webhook Secret's ca.crt); default: the kubeconfig's when the URL is its server, else the system's",
    )
    status.add_argument(
        "--tls-server-name",
        default=None,
        help="with --controller-url: the name the controller's certificate must carry, when the URL's "
        "host is not it (e.g. gpudra-controller.gpudra.svc through a port-forward)",
    )
    status.add_argument(
        "--web",
        action="store_true",
        help="serve the GPU map page (read-only, auto-refreshing) from your kubeconfig's view at --listen",
    )
    status.add_argument(
        "--listen", default="127.0.0.1:8090", help="with --web: HOST:PORT to serve the page on (0: any port)"
    )
    status.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="with --web: the namespace whose claims the page shows when your kubeconfig may not list "
        "them in every namespace (default: the kubeconfig context's)",
    )

    for name, about, options in (
        ("kubelet-plugin", "run the node plugin (DaemonSet)", PluginOptions),
        ("mps-host", "run the claims' MPS daemons for the plugin (DaemonSet)", MpsHostOptions),
        ("controller", "run the cluster controller (Deployment)", ControllerOptions),
    ):
        declared.add_arguments(_command(commands, name, about), options)
    return parser


def _migrate_parser(migrate: argparse.ArgumentParser) -> None:
    migrate.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="a YAML or JSON file of manifests (several documents, Lists, Helm's output); - : standard input",
    )
    migrate.add_argument(
        "--device-plugin-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the NVIDIA device plugin's config (version: v1; or its chart's ConfigMap): sharing replicas, "
        "renamed resources, flags.migStrategy",
    )
    migrate.add_argument(
        "--mig-strategy",
        type=Choice(("none", "single", "mixed")),
        default=None,
        help="the device plugin's MIG strategy, over the config's flags.migStrategy (default: the config's, "
        "else none)",
    )
    migrate.add_argument(
        "--gpu-memory",
        type=Bytes(minimum="1Gi"),
        default=None,
        help="the memory of the GPUs that time-slicing or MPS replicas divide (e.g. 81559Mi for an H100 "
        "80GB, as gpudra inventory shows it): a replica becomes a share of memory / replicas, in whole Gi",
    )
    migrate.add_argument(
        "--shares-by-count",
        action="store_true",
        help="a time-slicing or MPS replica becomes one share by count (capacity shares: 1) instead of a "
        "share of memory: the nodes then need the chart's kubeletPlugin.options.sharesPerGpu set to the "
        "replicas, which gives each share 1/replicas of the GPU's memory",
    )
    migrate.add_argument("--driver-name", default=DRIVER, type=DRIVER_NAME, help="gpudra's DRA driver name")


def _feature_gates(parser: argparse.ArgumentParser, whose: str) -> None:
    parser.add_argument(
        "--feature-gates",
        default="",
        type=_GATES,
        help=f"{whose} feature gates that differ from the release's defaults, as the components take them "
        "(DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true)",
    )


def _run_daemon(
    options: PluginOptions | MpsHostOptions | ControllerOptions, run: Callable[[threading.Event], None]
) -> int:
    """Logging as the options say, then `run(stop)` until SIGTERM or SIGINT sets `stop`."""
    logs.configure(fmt=options.log_format, level=options.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(stop)
    return 0


DAEMONS = ("kubelet-plugin", "controller", "mps-host")
_DEBUG = "GPUDRA_DEBUG=1 shows the traceback"


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit code (EXIT_CODES). Its errors are one line on stderr, the daemons' too: a
    daemon that cannot start (a kubeconfig it cannot use, a directory it cannot create, a port in use)
    says so in the one line its pod's status shows, exit 2. An unexpected error is exit 3, its
    traceback shown with GPUDRA_DEBUG=1, and in a daemon's log at --log-level DEBUG."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a usage error argparse printed (_Parser.error)
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    try:
        return _dispatch(args)
    except ConfigError as err:
        return _fail(args.command, str(err), EXIT_USAGE)
    except GpudraError as err:
        return _fail(args.command, str(err), 1 if args.command in DAEMONS else EXIT_USAGE)
    except BrokenPipeError:
        # The reader is gone (`| head`): what is left unwritten goes nowhere, including at exit's flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        return _fail(args.command, f"{where}{err.strerror or err}", EXIT_USAGE)
    except Exception as err:
        if os.environ.get("GPUDRA_DEBUG"):
            raise
        if args.command in DAEMONS:
            logging.getLogger("gpudra").debug("unexpected error", exc_info=True)
        what = f"{type(err).__name__}: {err}".splitlines()[0]
        return _fail(args.command, f"unexpected error (a bug: please report it; {_DEBUG}): {what}", EXIT_BUG)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "inventory":
        return _inventory(args)
    if args.command == "validate":
        return _validate(args)
    if args.command == "migrate":
        return _migrate(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "status":
        return _status(args)
    if args.command == "controller":
        return _controller(args)
    if args.command == "mps-host":
        return _mps_host(args)
    return _kubelet_plugin(args)


def _fail(command: str, message: str, code: int) -> int:
    print(f"gpudra {command}: {message}", file=sys.stderr)
    return code


# --- inventory ---------------------------------------------------------------------------------


def _inventory(args: argparse.Namespace) -> int:
    from gpudra.cli import inventory  # noqa: PLC0415 (see the imports above)

    node = declared.build(InventoryOptions, args)
    return inventory.show(
        nvml_name=node.nvml,
        publishing=node.publishing,
        driver=node.driver,
        node_name=node.node_name,
        fields=ServerFields.of_release(args.server_minor, parse_feature_gates(args.feature_gates)),
        output=args.output,
    )


# --- validate ------------------------------------------------------------------------------------


def _validate(args: argparse.Namespace) -> int:
    from gpudra.cli import validate  # noqa: PLC0415 (see the imports above)

    return validate.run(args.files, driver=args.driver_name, output=args.output)


# --- migrate -------------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace) -> int:
    from gpudra.cli import migrate  # noqa: PLC0415 (see the imports above)

    return migrate.run(
        args.files,
        driver=args.driver_name,
        device_plugin=args.device_plugin_config,
        mig_strategy=args.mig_strategy,
        gpu_memory=args.gpu_memory,
        by_count=args.shares_by_count,
    )


# --- explain -------------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    from gpudra.cli import explain  # noqa: PLC0415 (see the imports above)

    return explain.run(args)


# --- status --------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from gpudra.cli import status  # noqa: PLC0415 (see the imports above)

    if args.web:
        return _status_web(args)
    view = status.fetch(
        kubeconfig=args.kubeconfig,
        driver=args.driver_name,
        idle_after_seconds=args.idle_after_seconds,
        controller_url=args.controller_url,
        context=args.context,
        token=args.token,
        certificate_authority=args.certificate_authority,
        tls_server_name=args.tls_server_name,
    )
    sys.stdout.write(status.show(view, output=args.output))
    return 0


def _status_web(args: argparse.Namespace) -> int:
    from gpudra.cli import status_web  # noqa: PLC0415 (see the imports above)

    if args.controller_url:
        raise ConfigError(
            "--web reads the cluster with your kubeconfig; the controller serves the same page at its "
            "URL's /",
            field="--controller-url",
        )
    return status_web.serve(
        kubeconfig=args.kubeconfig,
        driver=args.driver_name,
        idle_after_seconds=args.idle_after_seconds,
        listen=args.listen,
        context=args.context,
        namespace=args.namespace,
    )


# --- controller ----------------------------------------------------------------------------------


def _controller(args: argparse.Namespace) -> int:
    from gpudra.controller import wiring  # noqa: PLC0415 (see the imports above)

    options = declared.build(ControllerOptions, args)
    return _run_daemon(options, lambda stop: wiring.run(options, stop=stop))


# --- kubelet-plugin ------------------------------------------------------------------------------


def _kubelet_plugin(args: argparse.Namespace) -> int:
    options = declared.build(PluginOptions, args)
    from gpudra.node import daemon  # noqa: PLC0415 (see the imports above)

    return _run_daemon(options, lambda stop: daemon.run(options, stop=stop))


# --- mps-host ------------------------------------------------------------------------------------


def _mps_host(args: argparse.Namespace) -> int:
    options = declared.build(MpsHostOptions, args)
    from gpudra.node import mps_host  # noqa: PLC0415 (see the imports above)

    return _run_daemon(options, lambda stop: mps_host.run(options, stop=stop))
