#!/usr/bin/env bash
# Side-by-side benchmark: ursula-node against the official single-node Rust Durable Streams
# server (crates.io `durable-streams` 0.1.5, default `--durability wal`: group-commit fsync),
# both on loopback, same load generator, alternating rounds in one run.
#
# Usage: e2e/bench/run.sh [--rounds N] [--duration 10s] [--soak SECONDS] [--gateway]
#   --gateway  also measure ursula-gateway's overhead: appends direct vs through it (and through
#              `ursula-bench relay`, a byte-copying relay: the floor of any proxy), and SSE
#              fan-out to 1,000 subscribers directly and through it
# Prints one JSON line per measurement and a summary with ratios.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=3
duration=10s
soak=0
gateway=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --soak) soak="$2"; shift 2 ;;
    --gateway) gateway=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build --release --locked -p ursula-node -p ursula-gateway -p ursula-bench
tools="$root/e2e/.tools"
official="$tools/bin/durable-streams-server"
if [ ! -x "$official" ]; then
  cargo install durable-streams --version 0.1.5 --locked --root "$tools"
fi
bench="$root/target/release/ursula-bench"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

"$root/target/release/ursula-node" --data-dir "$work/ursula" --listen 127.0.0.1:4537 \
  --admin-listen 127.0.0.1:4538 2>"$work/ursula.log" &
pids+=($!); ursula_pid=$!
"$official" --port 4637 --data-dir "$work/official" >"$work/official.log" 2>&1 &
pids+=($!); official_pid=$!
sleep 1.5

results="$work/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for target in official:4637:$official_pid ursula:4537:$ursula_pid; do
    IFS=: read -r label port pid <<<"$target"
    "$bench" --url "http://127.0.0.1:$port" --label "$label" append --duration "$duration" \
      --server-pids "$pid" | tee -a "$results"
  done
done
for target in official:4637 ursula:4537; do
  label="${target%%:*}"; port="${target##*:}"
  "$bench" --url "http://127.0.0.1:$port" --label "$label" sse --duration "$duration" \
    | tee -a "$results"
done
curl -s http://127.0.0.1:4538/metrics \
  | awk '/^ursula_appends_total /{a=$2} /^ursula_commit_batches_total /{b=$2} END {printf "{\"bench\":\"fsync\",\"label\":\"ursula\",\"appends\":%d,\"fsyncs\":%d,\"appends_per_fsync\":%.1f}\n", a, b, a/b}' \
  | tee -a "$results"

python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(label, bench, key):
    vals = [r[key] for r in rows if r["label"] == label and r["bench"] == bench]
    return statistics.median(vals) if vals else float("nan")
u, o = med("ursula", "append", "appends_per_sec"), med("official", "append", "appends_per_sec")
print()
print("append (100 streams, 32 writers, 256 B), median of rounds:")
print(f"  official: {o:8.0f}/s  p50 {med('official','append','p50_ms'):.3f} ms  p99 {med('official','append','p99_ms'):.3f} ms")
print(f"  ursula:   {u:8.0f}/s  p50 {med('ursula','append','p50_ms'):.3f} ms  p99 {med('ursula','append','p99_ms'):.3f} ms")
print(f"  ratio ursula/official: {u / o:.2f}x")
uc, oc = med("ursula", "append", "server_cpu_us_per_append"), med("official", "append", "server_cpu_us_per_append")
print(f"  server CPU per append: official {oc:.1f} µs, ursula {uc:.1f} µs ({uc / oc:.2f}x)")
print("SSE fan-out (100 subscribers, 200 msg/s), delivery latency:")
for label in ("official", "ursula"):
    r = [x for x in rows if x["label"] == label and x["bench"] == "sse"][0]
    print(f"  {label:9} p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  delivered {r['deliveries']}/{r['expected_deliveries']}")
f = [x for x in rows if x["bench"] == "fsync"][0]
print(f"ursula appends per fsync (whole run): {f['appends_per_fsync']}")
PY

if [ "$gateway" = 1 ]; then
  "$root/target/release/ursula-gateway" --listen 127.0.0.1:4547 --admin-listen 127.0.0.1:4548 \
    --upstream http://127.0.0.1:4537 2>"$work/gateway.log" &
  pids+=($!); gateway_pid=$!
  # The floor of any front door: a relay that copies bytes without reading HTTP.
  "$bench" relay --listen 127.0.0.1:4557 --upstream 127.0.0.1:4537 2>"$work/relay.log" &
  pids+=($!); relay_pid=$!
  sleep 1
  gw="$work/gateway.jsonl"
  for round in $(seq 1 "$rounds"); do
    "$bench" --url http://127.0.0.1:4537 --label direct append --duration "$duration" \
      --server-pids "$ursula_pid" | tee -a "$gw"
    "$bench" --url http://127.0.0.1:4557 --label relay append --duration "$duration" \
      --server-pids "$ursula_pid,$relay_pid" | tee -a "$gw"
    "$bench" --url http://127.0.0.1:4547 --label gateway append --duration "$duration" \
      --server-pids "$ursula_pid,$gateway_pid" | tee -a "$gw"
  done
  "$bench" --url http://127.0.0.1:4537 --label direct sse --subscribers 1000 --duration "$duration" | tee -a "$gw"
  "$bench" --url http://127.0.0.1:4557 --label relay sse --subscribers 1000 --duration "$duration" | tee -a "$gw"
  "$bench" --url http://127.0.0.1:4547 --label gateway sse --subscribers 1000 --duration "$duration" | tee -a "$gw"
  curl -s http://127.0.0.1:4548/metrics | grep -E '^ursula_gateway_shared_tail' | tee "$work/tails.txt"
  python3 - "$gw" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(label, key):
    return statistics.median([r[key] for r in rows if r["label"] == label and r["bench"] == "append"])
d, g = med("direct", "appends_per_sec"), med("gateway", "appends_per_sec")
print(f"\ngateway: {g:.0f}/s vs direct {d:.0f}/s: {g / d:.2f}x; p99 {med('gateway','p99_ms'):.3f} vs {med('direct','p99_ms'):.3f} ms (added {med('gateway','p99_ms') - med('direct','p99_ms'):.3f} ms)")
r = med("relay", "appends_per_sec")
print(f"byte relay (the floor of any proxy): {r:.0f}/s: {r / d:.2f}x direct; the gateway is {g / r:.2f}x the relay; relay p99 {med('relay','p99_ms'):.3f} ms")
dc, gc = med("direct", "server_cpu_us_per_append"), med("gateway", "server_cpu_us_per_append")
rc = med("relay", "server_cpu_us_per_append")
print(f"server CPU per append: node alone {dc:.1f} µs; node + gateway {gc:.1f} µs (the gateway adds {gc - dc:.1f} µs); node + relay {rc:.1f} µs (the relay adds {rc - dc:.1f} µs)")
for label in ("direct", "relay", "gateway"):
    s = [r for r in rows if r["bench"] == "sse" and r["label"] == label][0]
    print(f"SSE 1,000 subscribers, {label:7}: p50 {s['p50_ms']:.3f} ms p99 {s['p99_ms']:.3f} ms, delivered {s['deliveries']}/{s['expected_deliveries']}")
PY
fi

if [ "$soak" -gt 0 ]; then
  echo; echo "soak: ${soak}s of append load at 32 writers; RSS of ursula-node every 30 s (KiB):"
  "$bench" --url http://127.0.0.1:4537 --label soak append --duration "${soak}s" --warmup 0s >"$work/soak.json" &
  load=$!
  for _ in $(seq 0 30 "$soak"); do
    printf '%s ' "$(awk '/VmRSS/{print $2}' /proc/$ursula_pid/status)"
    sleep 30
  done
  wait $load; echo; cat "$work/soak.json"
fi
