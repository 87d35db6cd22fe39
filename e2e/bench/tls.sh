#!/usr/bin/env bash
# Client TLS benchmark: appends through a gateway with client TLS (`--tls-cert`, `--tls-key`)
# against appends through a plaintext gateway, both in front of the same node, same load
# generator, rounds alternating ABBA in one run. Prints one JSON line per measurement, then
# the medians and the TLS/plain ratio.
#
# Usage: e2e/bench/tls.sh [--rounds N] [--duration 10s] [--writers 32]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=4
duration=10s
writers=32
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --writers) writers="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build --release --locked -p ursula-node -p ursula-gateway -p ursula-bench
bin="$root/target/release"
# shellcheck source=processes.sh
source "$root/e2e/bench/processes.sh"

"$bin/ursula-node" issue-certs --dir "$work/tls" --nodes 1 --names 127.0.0.1 >/dev/null
"$bin/ursula-node" --data-dir "$work/node" --listen 127.0.0.1:4937 --admin-listen 127.0.0.1:4938 \
  2>"$work/node.log" &
pids+=($!); node_pid=$!
"$bin/ursula-gateway" --listen 127.0.0.1:4940 --admin-listen 127.0.0.1:4941 \
  --upstream http://127.0.0.1:4937 2>"$work/plain.log" &
pids+=($!); plain_pid=$!
"$bin/ursula-gateway" --listen 127.0.0.1:4942 --admin-listen 127.0.0.1:4943 \
  --upstream http://127.0.0.1:4937 --tls-cert "$work/tls/node-1.pem" --tls-key "$work/tls/node-1.key" \
  2>"$work/tls.log" &
pids+=($!); tls_pid=$!
for port in 4938 4941 4943; do
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/readyz" && break
    sleep 0.1
  done
done

results="$work/results.jsonl"
targets=("plain:http://127.0.0.1:4940:$plain_pid" "tls:https://127.0.0.1:4942:$tls_pid")
for round in $(seq 1 "$rounds"); do
  order=("${targets[@]}")
  [ $((round % 2)) = 0 ] && order=("${targets[1]}" "${targets[0]}")
  for target in "${order[@]}"; do
    label="${target%%:*}"; rest="${target#*:}"; pid="${rest##*:}"; url="${rest%:*}"
    "$bin/ursula-bench" --url "$url" --ca "$work/tls/ca.pem" --label "$label" append \
      --writers "$writers" --duration "$duration" --server-pids "$pid,$node_pid" \
      | tee -a "$results"
  done
done

python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and l.startswith("{")]
def med(label, key):
    return statistics.median(r[key] for r in rows if r["label"] == label and r["bench"] == "append")
p, t = med("plain", "appends_per_sec"), med("tls", "appends_per_sec")
print()
print(f"append through the gateway ({rows[0]['writers']} writers, 256 B), median of rounds:")
print(f"  plaintext: {p:8.0f}/s  p99 {med('plain','p99_ms'):.3f} ms  CPU {med('plain','server_cpu_us_per_append'):.1f} µs/append (gateway + node)")
print(f"  TLS:       {t:8.0f}/s  p99 {med('tls','p99_ms'):.3f} ms  CPU {med('tls','server_cpu_us_per_append'):.1f} µs/append (gateway + node)")
print(f"  ratio TLS/plain: {t / p:.3f}x")
PY
