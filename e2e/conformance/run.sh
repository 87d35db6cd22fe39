#!/usr/bin/env bash
# Runs the Durable Streams conformance suite (npm @durable-streams/server-conformance-tests,
# pinned in package-lock.json) against a freshly started ursula-node, through the compat
# family /v1/stream/{name}. Fails unless every default test passes.
#
# Usage: e2e/conformance/run.sh [--via-gateway] [path/to/target/dir]   (default: target/debug)
#   --via-gateway   put ursula-gateway in front of the node and run the suite through it
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
via_gateway=0
if [ "${1:-}" = "--via-gateway" ]; then via_gateway=1; shift; fi
bin_dir="$(realpath "${1:-$root/target/debug}")"
node_bin="$bin_dir/ursula-node"
expected=332

cd "$here"
if [ ! -d node_modules/@durable-streams/server-conformance-tests ]; then
  # `npm ci` rejects this lock file over an optional Windows-only dependency of vite that npm
  # leaves out of it; `npm install` installs the same locked versions.
  npm install --no-audit --no-fund --loglevel=error
fi

data="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$data"' EXIT

# Waits for "<name> serving client=ADDR" in a log and prints ADDR.
serving_addr() {
  local name="$1" log="$2" addr=""
  for _ in $(seq 1 100); do
    addr="$(sed -n "s/.*$name serving client=\([0-9.:]*\).*/\1/p" "$log")"
    [ -n "$addr" ] && { echo "$addr"; return 0; }
    sleep 0.1
  done
  echo "$name did not start:" >&2
  cat "$log" >&2
  return 1
}

# CI machines may have little free disk: lower the disk-pressure thresholds.
printf '[raft.wal]\nmin_available_size = 16777216\nresume_available_size = 33554432\n' >"$data/node.toml"
"$node_bin" --config "$data/node.toml" --data-dir "$data/data" --listen 127.0.0.1:0 \
  --admin-listen 127.0.0.1:0 --long-poll-timeout 500ms 2>"$data/node.log" &
pids+=($!)
addr="$(serving_addr ursula-node "$data/node.log")"
echo "conformance: ursula-node at http://$addr"
if [ "$via_gateway" = 1 ]; then
  "$bin_dir/ursula-gateway" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --upstream "http://$addr" 2>"$data/gateway.log" &
  pids+=($!)
  addr="$(serving_addr ursula-gateway "$data/gateway.log")"
  echo "conformance: through ursula-gateway at http://$addr"
fi

status=0
CONFORMANCE_TEST_URL="http://$addr" npx vitest run --reporter=default \
  --reporter=json --outputFile="$data/results.json" || status=$?
node -e '
  const r = require(process.argv[1]);
  const expected = Number(process.argv[2]);
  console.log(`conformance: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`);
  if (r.numFailedTests > 0 || r.numPassedTests < expected) {
    console.error(`conformance: expected ${expected} passing default tests`);
    process.exit(1);
  }
' "$data/results.json" "$expected" || status=1
exit $status
