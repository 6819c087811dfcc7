"""The Kubernetes API gpudra speaks, and the Kubernetes releases it supports. Pure; imports nothing.

One place for what would otherwise drift apart: the slices, the API client, the webhook's rules, the
claim status writes, the CLI's default and the publishing decisions all read these. The chart's
`kubeVersion` and the release `make test` pins are checked against them (tests/unit/model/test_kube_api.py).
"""

from __future__ import annotations

from typing import Final

# The DRA API group and the one version gpudra reads and writes (ResourceSlices, ResourceClaims,
# DeviceClasses, ResourceClaimTemplates).
GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# The group and version of gpudra's own documents, what `gpudra status -o json` (and the controller's
# /status) and `gpudra explain -o json` print: each carries it as `apiVersion`, beside its `kind`, so a
# tool that reads them can tell a later, changed schema (docs/cli.md). v1alpha1: fields may still change.
OUTPUT_API_VERSION: Final = "gpudra.io/v1alpha1"

# The oldest Kubernetes 1.x minor gpudra supports: the first that serves resource.k8s.io/v1. The chart's
# kubeVersion (deploy/helm/gpudra/Chart.yaml) names the same.
OLDEST_MINOR: Final = 34
# The release `make test` runs (deploy/local/go.mod pins k8s.io/kubernetes), and the minor `gpudra
# inventory` splits slices for unless told otherwise. `make compat` runs 1.34, 1.35 and 1.36 besides.
NEWEST_MINOR: Final = 37

# The first minor whose scheduler counts the counters that a device allowing multiple allocations
# consumes (a share device and its whole GPU stay exclusive): 1.34 and 1.35 do not, even with every gate.
SHARES_MINOR: Final = 36
# The first minor whose scheduler gathers only the pools relevant to a node, counter sets or not.
FAST_COUNTERS_MINOR: Final = 37
# The first minor whose API server and scheduler have the DRA feature gates gpudra's forms rely on
# (DRAPartitionableDevices, DRAConsumableCapacity, DRADeviceTaints) on by default: beta there, alpha
# and off in 1.34 and 1.35.
DRA_GATES_MINOR: Final = 36
# The minor whose scheduler with DRADeviceTaints on schedules nothing unless the API server also serves
# resource.k8s.io/v1alpha3 (DeviceTaintRules): `--runtime-config=resource.k8s.io/v1alpha3=true`.
TAINTS_ALPHA_API_MINOR: Final = 34
