#!/usr/bin/env bash
# Subscriptions benchmark, on one node:
# - the cost: the standard append load (100 streams, 32 writers, 256 B) without subscriptions
#   and with 1,000 webhook subscriptions over those streams (10 per stream, each answered by a
#   receiver in the load generator that acknowledges every wake), rounds alternating ABBA on
#   fresh streams of the same node; the ratio of appends/s;
# - the wake latency: 1,000 subscriptions over 100 streams at 200 appends/s, from each append's
#   acknowledgement to the webhook that tells each of its 10 subscribers.
#
# Usage: e2e/bench/subscriptions.sh [--rounds N] [--duration 10s]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=4
duration=10s
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build --release --locked -p ursula-node -p ursula-bench
bin="$root/target/release"
# shellcheck source=processes.sh
source "$root/e2e/bench/processes.sh"

"$bin/ursula-node" --data-dir "$work/node" --listen 127.0.0.1:5037 --admin-listen 127.0.0.1:5038 \
  2>"$work/node.log" &
pids+=($!); node_pid=$!
for _ in $(seq 1 100); do
  curl -s -o /dev/null "http://127.0.0.1:5038/readyz" && break
  sleep 0.1
done

results="$work/results.jsonl"
for round in $(seq 1 "$rounds"); do
  order=(0 1000)
  [ $((round % 2)) = 0 ] && order=(1000 0)
  for subscriptions in "${order[@]}"; do
    "$bin/ursula-bench" --url http://127.0.0.1:5037 --label "subs-$subscriptions" append \
      --duration "$duration" --subscriptions "$subscriptions" --server-pids "$node_pid" \
      | tee -a "$results"
  done
done
"$bin/ursula-bench" --url http://127.0.0.1:5037 --label wake wake --streams 100 \
  --subscriptions 1000 --rate 200 --duration "$duration" | tee -a "$results"

python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and l.startswith("{")]
def med(label, key):
    return statistics.median(r[key] for r in rows if r["label"] == label and r["bench"] == "append")
base, subs = med("subs-0", "appends_per_sec"), med("subs-1000", "appends_per_sec")
wake = [r for r in rows if r["bench"] == "wake"][-1]
print()
print("append (100 streams, 32 writers, 256 B), median of rounds:")
print(f"  no subscriptions:     {base:8.0f}/s  p99 {med('subs-0','p99_ms'):.2f} ms  CPU {med('subs-0','server_cpu_us_per_append'):.1f} µs/append")
print(f"  1,000 subscriptions:  {subs:8.0f}/s  p99 {med('subs-1000','p99_ms'):.2f} ms  CPU {med('subs-1000','server_cpu_us_per_append'):.1f} µs/append, {med('subs-1000','webhooks_per_sec'):.0f} webhooks/s")
print(f"  ratio with/without: {subs / base:.3f}x")
print(f"wake latency, 1,000 subscriptions over 100 streams at {wake['rate']} appends/s: "
      f"p50 {wake['wake_p50_ms']:.1f} ms, p99 {wake['wake_p99_ms']:.1f} ms, max {wake['wake_max_ms']:.1f} ms "
      f"({wake['webhooks']} webhooks, {wake['never_told']} subscriber-appends never told)")
PY
