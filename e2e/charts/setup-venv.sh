#!/usr/bin/env bash
# Creates (once) the Python environment of the chart and kube e2e tests: a real Helm v4
# library (helm-python-sdk) and kubernetes-validate, pinned in requirements.txt.
# Usage: e2e/charts/setup-venv.sh VENV_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:?usage: setup-venv.sh VENV_DIR}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi
