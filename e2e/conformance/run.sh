#!/usr/bin/env bash
# Runs the Durable Streams conformance suite (npm @durable-streams/server-conformance-tests,
# pinned in package-lock.json) against a freshly started ursula-node, through the compat
# family /v1/stream/{name}. Fails unless every default test passes.
#
# Usage: e2e/conformance/run.sh [--cluster] [--via-gateway] [path/to/target/dir]
#                                                        (default target dir: target/debug)
#   --cluster       start 3 voters on loopback and send the suite to a follower of the
#                   compatibility bucket's group (fetch follows its 307s to the leader)
#   --via-gateway   put ursula-gateway in front of the node (or of all 3 voters, with
#                   --cluster) and run the suite through it
#   --slow          a slow machine (with --cluster): each voter runs in its own CPU cgroup
#                   (e2e/slow/throttle.sh) and with a slow disk (e2e/slow/slow_fsync.c); after
#                   the suite, every voter's request latencies are checked against the deadline
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
via_gateway=0
cluster=0
slow=0
while [ $# -gt 0 ]; do
  case "$1" in
    --via-gateway) via_gateway=1; shift ;;
    --cluster) cluster=1; shift ;;
    --slow) slow=1; shift ;;
    *) break ;;
  esac
done
bin_dir="$(realpath "${1:-$root/target/debug}")"
node_bin="$bin_dir/ursula-node"
expected=338

cd "$here"
if [ ! -d node_modules/@durable-streams/server-conformance-tests ] || [ ! -d node_modules/undici ]; then
  # `npm ci` rejects this lock file over an optional Windows-only dependency of vite that npm
  # leaves out of it; `npm install` installs the same locked versions.
  npm install --no-audit --no-fund --loglevel=error
fi

data="$(mktemp -d)"
pids=()
# CONFORMANCE_LOGS=DIR keeps the processes' logs there.
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true
  [ -n "${CONFORMANCE_LOGS:-}" ] && mkdir -p "$CONFORMANCE_LOGS" && cp "$data"/*.log "$CONFORMANCE_LOGS"/ 2>/dev/null
  rm -rf "$data"' EXIT

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
limits='[raft.wal]\nmin_available_size = 16777216\nresume_available_size = 33554432\n'
# Fixed loopback ports, as many as asked, that bind now, below the kernel's ephemeral range:
# voters must know each other's addresses, and the nodes the URL clients use (a gateway's, for
# subscription callbacks) before it starts. A port from bind(0) is ephemeral: released for a
# voter, it can first become the source port of another voter's outgoing connection, and that
# voter then cannot start.
free_ports() {
  node -e '
    const net = require("net");
    const fs = require("fs");
    const floor = 10000;
    let ceiling = parseInt(fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8"), 10);
    if (!(ceiling > floor + 1000)) ceiling = 32768;
    const free = (port) => new Promise((ok) => {
      const server = net.createServer();
      server.once("error", () => ok(false));
      server.listen(port, "127.0.0.1", () => server.close(() => ok(true)));
    });
    (async () => {
      const found = [];
      let port = floor + (process.pid % (ceiling - floor));
      const wanted = Number(process.argv[1]);
      for (let tries = 0; found.length < wanted && tries < ceiling - floor; tries++) {
        if (await free(port)) found.push(port);
        port = port + 1 < ceiling ? port + 1 : floor;
      }
      if (found.length < wanted) throw new Error("not enough free loopback ports below " + ceiling);
      console.log(found.join(" "));
    })();
  ' "$1"
}
# Client, admin and cluster port of each of 3 voters, then the gateway's.
read -r -a ports <<<"$(free_ports 10)"
gateway_port="${ports[9]}"
# Where subscription callback and key URLs point: the URL the suite is given. Through a
# gateway, its own (it names upstreams by their own addresses); a node takes the request's
# Host.
public_url=""
[ "$via_gateway" = 1 ] && public_url="http://127.0.0.1:$gateway_port"
server_extra=""
[ -n "$public_url" ] && server_extra="public_url = \"$public_url\"\n"
if [ "$cluster" = 1 ]; then
  port() { echo "${ports[$((3 * ($1 - 1) + $2))]}"; }
  # Every voter signs webhooks and wake tokens with the same key.
  "$node_bin" signing-key --out "$data/signing-key.pem" >/dev/null
  subscriptions="[subscriptions]\nsigning_key_file = \"$data/signing-key.pem\"\nallow_loopback_webhooks = true\n"
  # Mutual TLS between the voters, as in production: a CA and a certificate for each.
  "$node_bin" issue-certs --dir "$data/tls" --nodes 1,2,3 >/dev/null
  peers=""
  for id in 1 2 3; do
    peers+="[[raft.peers]]\nid = $id\ncluster_url = \"https://127.0.0.1:$(port $id 2)\"\nclient_url = \"http://127.0.0.1:$(port $id 0)\"\n"
  done
  for id in 1 2 3; do
    # Raft timeouts and the request deadline are the product's defaults. The long-poll
    # timeout is shorter than the default 20 s because the suite waits out long-polls that
    # see no data, and some of its tests allow less than 20 s for that.
    printf "node_id = $id\n[server]\nlisten = \"127.0.0.1:$(port $id 0)\"\nadmin_listen = \"127.0.0.1:$(port $id 1)\"\ncluster_listen = \"127.0.0.1:$(port $id 2)\"\nlong_poll_timeout = \"500ms\"\n${server_extra}cluster_tls = { ca_file = \"$data/tls/ca.pem\", cert_file = \"$data/tls/node-$id.pem\", key_file = \"$data/tls/node-$id.key\" }\n$peers$limits$subscriptions" >"$data/node-$id.toml"
    launch=()
    [ "$slow" = 1 ] && launch=("$root/e2e/slow/exec.sh" "conformance-$$-$id")
    "${launch[@]}" "$node_bin" --config "$data/node-$id.toml" --data-dir "$data/node-$id" 2>"$data/node-$id.log" &
    pids+=($!)
  done
  for id in 1 2 3; do
    serving_addr ursula-node "$data/node-$id.log" >/dev/null
  done
  # Ready = every group knows its leader; then pick a node that redirects the compat bucket.
  addr=""
  for _ in $(seq 1 100); do
    ready=0
    for id in 1 2 3; do
      code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(port $id 1)/readyz" || true)"
      [ "$code" = 200 ] && ready=$((ready + 1))
    done
    if [ "$ready" = 3 ]; then
      for id in 1 2 3; do
        code="$(curl -s -o /dev/null -w '%{http_code}' -X PUT "http://127.0.0.1:$(port $id 0)/default")"
        [ "$code" = 307 ] && { addr="127.0.0.1:$(port $id 0)"; break; }
      done
      [ -n "$addr" ] && break
    fi
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "conformance: the cluster did not become ready" >&2; tail -5 "$data"/node-*.log >&2; exit 1; }
  echo "conformance: 3-voter cluster, sent to follower http://$addr"
else
  printf "[server]\n$server_extra$limits" >"$data/node.toml"
  "$node_bin" --config "$data/node.toml" --data-dir "$data/data" --listen 127.0.0.1:0 \
    --admin-listen 127.0.0.1:0 --long-poll-timeout 500ms 2>"$data/node.log" &
  pids+=($!)
  addr="$(serving_addr ursula-node "$data/node.log")"
  echo "conformance: ursula-node at http://$addr"
fi
if [ "$via_gateway" = 1 ]; then
  upstreams=(--upstream "http://$addr")
  if [ "$cluster" = 1 ]; then
    upstreams=()
    for id in 1 2 3; do upstreams+=(--upstream "http://127.0.0.1:$(port $id 0)"); done
  fi
  "$bin_dir/ursula-gateway" --listen "127.0.0.1:$gateway_port" --admin-listen 127.0.0.1:0 \
    "${upstreams[@]}" 2>"$data/gateway.log" &
  pids+=($!)
  addr="$(serving_addr ursula-gateway "$data/gateway.log")"
  echo "conformance: through ursula-gateway at http://$addr"
fi
status=0
started=$(date +%s)
started_at="$(date -u +%Y-%m-%dT%H:%M:%S)"
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
if [ "$cluster" = 1 ]; then
  # What a slow machine must not break: every request answered within the node's deadline
  # (server.request_timeout, 5 s by default; 1 s more for reading a body and writing the
  # answer), and quiet logs.
  minutes="$(awk -v s="$(( $(date +%s) - started ))" 'BEGIN { printf "%.2f", (s < 1 ? 1 : s) / 60 }')"
  for id in 1 2 3; do
    curl -s "http://127.0.0.1:$(port $id 1)/metrics" >"$data/metrics-$id.txt" || true
    if [ "$slow" = 1 ]; then
      # Proof that the slow machine was in force: the voter's CPU was throttled (cgroup
      # v1 nr_throttled, v2 nr_throttled), and (checked below) no fsync took under 5 ms.
      throttled=""
      for group in "/sys/fs/cgroup/cpu/ursula-slow/conformance-$$-$id" "/sys/fs/cgroup/ursula-slow/conformance-$$-$id"; do
        [ -f "$group/cpu.stat" ] && throttled="$(sed -n 's/^nr_throttled //p' "$group/cpu.stat")"
      done
      echo "conformance: voter $id was throttled in ${throttled:-no} CPU periods"
      [ "${throttled:-0}" -gt 0 ] || { echo "conformance: voter $id was not CPU-throttled" >&2; status=1; }
    fi
  done
  node -e '
    const fs = require("fs");
    const [dir, minutes, deadline, startedAt, slow] = [process.argv[1], Number(process.argv[2]),
      Number(process.argv[3]), process.argv[4], process.argv[5] === "1"];
    let failed = false;
    const buckets = new Map();
    let count = 0, max = 0;
    for (const id of [1, 2, 3]) {
      const text = fs.readFileSync(`${dir}/metrics-${id}.txt`, "utf8");
      for (const line of text.split("\n")) {
        let m = line.match(/^ursula_http_request_seconds_bucket\{le="([^"]+)"\} (\d+)/);
        if (m && m[1] !== "+Inf") buckets.set(Number(m[1]), (buckets.get(Number(m[1])) || 0) + Number(m[2]));
        m = line.match(/^ursula_http_request_seconds_count (\d+)/);
        if (m) count += Number(m[1]);
        m = line.match(/^ursula_http_request_seconds_max (\S+)/);
        if (m) max = Math.max(max, Number(m[1]));
      }
      // Steady state: from the second after the suite started (the cluster was up with its
      // leaders; stale vote answers of the first elections come within that second).
      const lines = fs.readFileSync(`${dir}/node-${id}.log`, "utf8").split("\n")
        .filter((l) => l.slice(0, 19) > startedAt);
      const errors = lines.filter((l) => / ERROR /.test(l)).length;
      console.log(`conformance: voter ${id} logged ${(lines.length / minutes).toFixed(1)} lines/min during the suite (${lines.length} lines, ${errors} at ERROR, over ${minutes} min)`);
    }
    const p99 = [...buckets.entries()].sort((a, b) => a[0] - b[0]).find(([, n]) => n >= 0.99 * count);
    console.log(`conformance: ${count} requests on the voters (live reads not counted): p99 <= ${p99 ? p99[0] * 1000 : "?"} ms, max ${(max * 1000).toFixed(1)} ms`);
    if (count === 0) { console.error("conformance: the voters counted no requests"); failed = true; }
    if (slow) {
      for (const id of [1, 2, 3]) {
        const text = fs.readFileSync(`${dir}/metrics-${id}.txt`, "utf8");
        const fast = Number((text.match(/^ursula_fsync_seconds_bucket\{le="0.005"\} (\d+)/m) || [])[1]);
        const all = Number((text.match(/^ursula_fsync_seconds_count (\d+)/m) || [])[1]);
        console.log(`conformance: voter ${id}: ${all} fsyncs, ${fast} of them under 5 ms`);
        if (!(all > 0) || fast !== 0) { console.error(`conformance: the slow disk was not in force on voter ${id}`); failed = true; }
      }
    }
    if (max > deadline + 1) { console.error(`conformance: a request took ${max.toFixed(2)} s, past the ${deadline} s deadline`); failed = true; }
    process.exit(failed ? 1 : 0);
  ' "$data" "$minutes" 5 "$started_at" "$slow" || status=1
fi
exit $status
