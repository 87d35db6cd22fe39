#!/usr/bin/env bash
# Creates (once) the real S3-API server the cold-tier tests run against: moto's server mode
# (PyPI moto[server], pinned in requirements.txt), in e2e/.tools/s3. The tests start it as
# a process on a free port (e2e/testkit/src/s3.rs).
# Usage: e2e/s3/setup.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/../.tools/s3"
if [ ! -x "$venv/bin/moto_server" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi
echo "S3-API server: $venv/bin/moto_server"
