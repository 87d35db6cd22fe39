#!/usr/bin/env bash
# Subscriptions benchmark, on one node:
# - the cost: the standard append load (100 streams, 32 writers, 256 B) without subscriptions,
#   with 1,000 webhook subscriptions over those streams (10 per stream) whose consumer (a
#   receiver in the load generator) acknowledges every wake at once, so that nearly every
#   append sends webhooks, and with 1,000 whose consumer keeps its wakes open (busy); rounds
#   rotate on fresh streams of the same node; the ratios of appends/s;
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
cases=("none:0:done" "done:1000:done" "busy:1000:busy")
for round in $(seq 1 "$rounds"); do
  for i in 0 1 2; do
    IFS=: read -r label subscriptions consumers <<<"${cases[$(((i + round) % 3))]}"
    "$bin/ursula-bench" --url http://127.0.0.1:5037 --label "$label" append \
      --duration "$duration" --subscriptions "$subscriptions" --consumers "$consumers" \
      --server-pids "$node_pid" | tee -a "$results"
  done
done
"$bin/ursula-bench" --url http://127.0.0.1:5037 --label wake wake --streams 100 \
  --subscriptions 1000 --rate 200 --duration "$duration" | tee -a "$results"

python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and l.startswith("{")]
def med(label, key):
    return statistics.median(r[key] for r in rows if r["label"] == label and r["bench"] == "append")
base = med("none", "appends_per_sec")
wake = [r for r in rows if r["bench"] == "wake"][-1]
print()
print("append (100 streams, 32 writers, 256 B), median of rounds:")
for label, what in [("none", "no subscriptions"), ("done", "1,000, consumers ack at once"), ("busy", "1,000, consumers busy")]:
    rate = med(label, "appends_per_sec")
    print(f"  {what:30} {rate:8.0f}/s ({rate / base:.3f}x)  p99 {med(label,'p99_ms'):.2f} ms  "
          f"CPU {med(label,'server_cpu_us_per_append'):.1f} µs/append  {med(label,'webhooks_per_sec'):.0f} webhooks/s")
print(f"wake latency, 1,000 subscriptions over 100 streams at {wake['rate']} appends/s: "
      f"p50 {wake['wake_p50_ms']:.1f} ms, p99 {wake['wake_p99_ms']:.1f} ms, max {wake['wake_max_ms']:.1f} ms "
      f"({wake['webhooks']} webhooks, {wake['never_told']} subscriber-appends never told)")
PY
