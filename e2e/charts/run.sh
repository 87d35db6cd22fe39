#!/usr/bin/env bash
# Chart tests without a cluster: renders charts/ with a real Helm v4 library (PyPI
# helm-python-sdk), validates every rendered object against the Kubernetes schemas
# (kubernetes-validate) and the UrsulaCluster against its CRD, lints, and checks that
# values.schema.json rejects bad values. Installs its Python packages into e2e/.tools.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/e2e/.tools/chart-venv"
"$here/setup-venv.sh" "$venv"
cd "$root"
"$venv/bin/python" -m unittest -v "$here/test_charts.py"
