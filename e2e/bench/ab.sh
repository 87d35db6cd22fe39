#!/usr/bin/env bash
# Paired A/B of two ursula-node builds on one machine: alternates short runs of A and B (in
# alternating order), and prints per pair the ratio B/A of appends/s and of server CPU per
# append, then the medians. On a shared 2-core host throughput drifts by ±15% from one
# minute to the next; the ratio within a pair, taken seconds apart, is what is comparable.
#
# Usage: e2e/bench/ab.sh BIN_A BIN_B [--pairs 6] [--duration 3s] [--writers 32]
# (build B, copy it away, build A: e.g. `cp target/release/ursula-node /tmp/node-b`)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -ge 2 ] || { sed -n 2,8p "$0" >&2; exit 2; }
a_bin="$1"; b_bin="$2"; shift 2
pairs=6
duration=3s
writers=32
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --writers) writers="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
cargo build --release --locked -p ursula-bench
bench="$root/target/release/ursula-bench"
work="$(mktemp -d)"
server=""
stop() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  server=""
}
trap 'stop; rm -rf "$work"' EXIT

# One run of a build on a fresh data directory; prints the bench's JSON line.
run() {
  rm -rf "$work/data"
  # The server's output goes to a file: inside $( ) an inherited stdout would keep the
  # substitution waiting for the server to exit.
  "$1" --data-dir "$work/data" --listen 127.0.0.1:4837 --admin-listen 127.0.0.1:4838 \
    >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 50); do
    curl -sf -o /dev/null http://127.0.0.1:4838/readyz && break
    sleep 0.1
  done
  "$bench" --url http://127.0.0.1:4837 --label ab append --writers "$writers" \
    --duration "$duration" --warmup 1s --server-pids "$server" 2>/dev/null
  stop
}

results="$work/pairs.jsonl"
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) = 0 ]; then a="$(run "$a_bin")"; b="$(run "$b_bin")"
  else b="$(run "$b_bin")"; a="$(run "$a_bin")"; fi
  echo "{\"a\":$a,\"b\":$b}" >>"$results"
done

python3 - "$results" <<'PY'
import json, sys, statistics
pairs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rate, cpu = [], []
for p in pairs:
    a, b = p["a"], p["b"]
    r = b["appends_per_sec"] / a["appends_per_sec"]
    c = b["server_cpu_us_per_append"] / a["server_cpu_us_per_append"]
    rate.append(r); cpu.append(c)
    print(f"A {a['appends_per_sec']:7.0f}/s p99 {a['p99_ms']:.2f} ms cpu {a['server_cpu_us_per_append']:5.1f} µs | "
          f"B {b['appends_per_sec']:7.0f}/s p99 {b['p99_ms']:.2f} ms cpu {b['server_cpu_us_per_append']:5.1f} µs | "
          f"B/A rate {r:.3f} cpu {c:.3f}")
print(f"median B/A over {len(pairs)} pairs: appends/s {statistics.median(rate):.3f}, CPU per append {statistics.median(cpu):.3f}")
PY
