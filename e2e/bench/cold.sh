#!/usr/bin/env bash
# Cold-tier benchmark: three single nodes of the same build, alternating rounds in one run:
#   local    no cold tier: every record stays in redb
#   cold-dir [storage.cold] in a local directory (file://): the cold tier's own cost
#   cold-s3  [storage.cold] on a real S3-API server (moto, Python, from e2e/s3/setup.sh):
#            a floor, not what MinIO or S3 give
# Both cold nodes flush 1 MiB objects, every 250 ms. Per round and node: appends (100 streams,
# 32 writers, 256 B; the streams pass 1 MiB, so flushes run during the measurement), then a
# 64 MiB stream filled, left 5 s for the flush, and read from the start by one client.
#
# Usage: e2e/bench/cold.sh [--rounds N] [--duration 10s]
# Prints one JSON line per measurement, then medians and ratios against `local`.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=3
duration=10s
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build --release --locked -p ursula-node -p ursula-bench
e2e/s3/setup.sh >/dev/null
node="$root/target/release/ursula-node"
bench="$root/target/release/ursula-bench"
# shellcheck source=processes.sh
source "$root/e2e/bench/processes.sh"

"$root/e2e/.tools/s3/bin/moto_server" -H 127.0.0.1 -p 4799 >"$work/s3.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -s -o /dev/null http://127.0.0.1:4799/ && break
  sleep 0.1
done
curl -s -o /dev/null -X PUT http://127.0.0.1:4799/ursula-bench

flush='segment_size = 1048576\nflush_interval = "250ms"\n'
printf "" >"$work/local.toml"
printf "[storage.cold]\nurl = \"file://$work/cold-dir-objects\"\n$flush" >"$work/cold-dir.toml"
printf "[storage.cold]\nurl = \"s3://ursula-bench/bench\"\nendpoint = \"http://127.0.0.1:4799\"\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"bench\"\nsecret_access_key = \"bench\"\n$flush" \
  >"$work/cold-s3.toml"
targets=()
port=4770
for label in local cold-dir cold-s3; do
  "$node" --config "$work/$label.toml" --data-dir "$work/$label" \
    --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" 2>"$work/$label.log" &
  pids+=($!)
  targets+=("$label:$port:$!")
  port=$((port + 10))
done
for target in "${targets[@]}"; do
  IFS=: read -r _ port _ <<<"$target"
  for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((port + 1))/readyz" || true)" = 200 ] && break
    sleep 0.1
  done
done

metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
results="$work/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for target in "${targets[@]}"; do
    IFS=: read -r label port pid <<<"$target"
    "$bench" --url "http://127.0.0.1:$port" --label "$label" --prefix /v1/stream/bench append \
      --duration "$duration" --server-pids "$pid" | tee -a "$results"
    fetched="$(metric $((port + 1)) ursula_cold_object_fetches_total)"
    "$bench" --url "http://127.0.0.1:$port" --label "$label" --prefix /v1/stream/catchup \
      catch-up --settle 5s | tee -a "$results"
    now="$(metric $((port + 1)) ursula_cold_object_fetches_total)"
    echo "{\"bench\":\"fetches\",\"label\":\"$label\",\"objects\":$(( ${now:-0} - ${fetched:-0} ))}" \
      | tee -a "$results"
  done
done
for target in "${targets[@]}"; do
  IFS=: read -r label port _ <<<"$target"
  echo "$label: $(metric $((port + 1)) ursula_cold_flushes_total) flushes, $(metric $((port + 1)) ursula_cold_flushed_bytes_total) bytes flushed" \
    | sed 's/^\(local\): .*/\1: no cold tier/'
done

python3 - "$results" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(label, bench, key):
    return statistics.median(r[key] for r in rows if r["label"] == label and r["bench"] == bench)
print()
print("median of rounds        appends/s   ratio    p99 ms   CPU µs/append   catch-up MiB/s   ratio   objects fetched per read")
for label in ["local", "cold-dir", "cold-s3"]:
    a, r = med(label, "append", "appends_per_sec"), med(label, "catch-up", "mib_per_s")
    print(f"  {label:9}            {a:9.0f}   {a / med('local', 'append', 'appends_per_sec'):5.2f}x"
          f"  {med(label, 'append', 'p99_ms'):7.2f}   {med(label, 'append', 'server_cpu_us_per_append'):13.1f}"
          f"   {r:14.0f}   {r / med('local', 'catch-up', 'mib_per_s'):5.2f}x"
          f"   {med(label, 'fetches', 'objects'):6.0f}")
PY
