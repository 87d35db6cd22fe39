#!/usr/bin/env bash
# Paired A/B of two ursula-node builds on one machine: alternates short runs of A and B (in
# alternating order), and prints per pair the ratio B/A of appends/s and of server CPU per
# append, then the medians. On a shared 2-core host throughput drifts by ±15% from one
# minute to the next; the ratio within a pair, taken seconds apart, is what is comparable.
#
# Usage: e2e/bench/ab.sh BIN_A BIN_B [--pairs 6] [--duration 3s] [--writers 32] [--bench sse]
# (build B, copy it away, build A: e.g. `cp target/release/ursula-node /tmp/node-b`)
# --bench sse: 100 SSE subscribers of one stream, 200 appends/s; the ratio is of server CPU
# per delivery (and of p99 delivery latency) instead of appends/s.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -ge 2 ] || { sed -n 2,10p "$0" >&2; exit 2; }
a_bin="$1"; b_bin="$2"; shift 2
pairs=6
duration=3s
writers=32
kind=append
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --writers) writers="$2"; shift 2 ;;
    --bench) kind="$2"; shift 2 ;;
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
  if [ "$kind" = sse ]; then
    "$bench" --url http://127.0.0.1:4837 --label ab sse --subscribers 100 --rate 200 \
      --duration "$duration" --server-pids "$server" 2>/dev/null
  else
    "$bench" --url http://127.0.0.1:4837 --label ab append --writers "$writers" \
      --duration "$duration" --warmup 1s --server-pids "$server" 2>/dev/null
  fi
  stop
}

results="$work/pairs.jsonl"
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) = 0 ]; then a="$(run "$a_bin")"; b="$(run "$b_bin")"
  else b="$(run "$b_bin")"; a="$(run "$a_bin")"; fi
  echo "{\"a\":$a,\"b\":$b}" >>"$results"
done

python3 - "$results" "$kind" <<'PY'
import json, sys, statistics
pairs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if sys.argv[2] == "sse":
    cpu, p99 = [], []
    for p in pairs:
        a, b = p["a"], p["b"]
        c = b["server_cpu_us_per_delivery"] / a["server_cpu_us_per_delivery"]
        cpu.append(c); p99.append(b["p99_ms"] - a["p99_ms"])
        print(f"A {a['deliveries']} deliveries p99 {a['p99_ms']:.2f} ms cpu {a['server_cpu_us_per_delivery']:5.2f} µs | "
              f"B {b['deliveries']} deliveries p99 {b['p99_ms']:.2f} ms cpu {b['server_cpu_us_per_delivery']:5.2f} µs | "
              f"B/A cpu {c:.3f}")
    print(f"median over {len(pairs)} pairs: B/A CPU per delivery {statistics.median(cpu):.3f}, "
          f"B-A p99 {statistics.median(p99):+.2f} ms")
    sys.exit(0)
rate, cpu, p99 = [], [], []
for p in pairs:
    a, b = p["a"], p["b"]
    r = b["appends_per_sec"] / a["appends_per_sec"]
    c = b["server_cpu_us_per_append"] / a["server_cpu_us_per_append"]
    rate.append(r); cpu.append(c); p99.append(b["p99_ms"] - a["p99_ms"])
    print(f"A {a['appends_per_sec']:7.0f}/s p99 {a['p99_ms']:.2f} ms cpu {a['server_cpu_us_per_append']:5.1f} µs | "
          f"B {b['appends_per_sec']:7.0f}/s p99 {b['p99_ms']:.2f} ms cpu {b['server_cpu_us_per_append']:5.1f} µs | "
          f"B/A rate {r:.3f} cpu {c:.3f}")
print(f"median B/A over {len(pairs)} pairs: appends/s {statistics.median(rate):.3f}, CPU per append {statistics.median(cpu):.3f}, "
      f"B-A p99 {statistics.median(p99):+.2f} ms")
PY
