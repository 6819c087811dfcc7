#!/usr/bin/env bash
# Installs Prometheus and promtool from Debian's package when missing (tests/integration/
# test_monitoring.py: promtool checks and tests the chart's alerts; tests/e2e: a real Prometheus
# scrapes the chart's monitors) and prints promtool's path. Cold: about 30 s (the package and its
# dependencies); warm: a dpkg query. The package's service is not used: the tests run their own
# Prometheus, on a free port, with their own configuration.
set -euo pipefail
cd "$(dirname "$0")"
source ../packages.sh
ensure_packages prometheus
command -v promtool
