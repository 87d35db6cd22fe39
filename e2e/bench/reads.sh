#!/usr/bin/env bash
# Catch-up reads on a 3-voter cluster (mutual TLS, fsync on every voter): build A against build
# B, alternating A B B A rounds in one run, same load generator, each round on a fresh cluster.
# Made to price linearizable reads (every read waits for a quorum's confirmation), so A is the
# build before them and B this one; any two builds with cluster TLS work.
#
# Usage: e2e/bench/reads.sh --a BIN --b BIN [--rounds N] [--bytes B] [--size S] [--readers R]
#   --bench BIN   the ursula-bench binary (default: this checkout's release build)
# Prints one JSON line per measurement (label a or b), then the medians and the ratio b/a.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
a="" b="" rounds=2 bytes=$((32 * 1024 * 1024)) size=1024 readers=4
bench="$root/target/release/ursula-bench"
while [ $# -gt 0 ]; do
  case "$1" in
    --a) a="$2"; shift 2 ;;
    --b) b="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --readers) readers="$2"; shift 2 ;;
    --bench) bench="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$a" ] && [ -x "$b" ] || { echo "--a and --b name ursula-node binaries" >&2; exit 2; }
# shellcheck source=processes.sh
source "$root/e2e/bench/processes.sh"
results="$work/results.jsonl"

# run_round LABEL BIN BASE: a fresh 3-voter cluster (client ports BASE+10/20/30), one catch-up.
run_round() {
  local label="$1" node="$2" base="$3" dir="$work/$1-$3" peers=""
  mkdir -p "$dir"
  "$node" issue-certs --dir "$dir/tls" --nodes 1,2,3 >/dev/null
  for id in 1 2 3; do
    p=$((base + 10 * id))
    peers+="[[raft.peers]]\nid = $id\ncluster_url = \"https://127.0.0.1:$((p + 2))\"\nclient_url = \"http://127.0.0.1:$p\"\n"
  done
  local round_pids=()
  for id in 1 2 3; do
    p=$((base + 10 * id))
    printf "node_id = $id\ndata_dir = \"$dir/node-$id\"\n[server]\nlisten = \"127.0.0.1:$p\"\nadmin_listen = \"127.0.0.1:$((p + 1))\"\ncluster_listen = \"127.0.0.1:$((p + 2))\"\ncluster_tls = { ca_file = \"$dir/tls/ca.pem\", cert_file = \"$dir/tls/node-$id.pem\", key_file = \"$dir/tls/node-$id.key\" }\n[raft]\ngroup_count = 16\n$peers" \
      >"$dir/node-$id.toml"
    "$node" --config "$dir/node-$id.toml" 2>"$dir/node-$id.log" &
    pids+=($!); round_pids+=($!)
  done
  for _ in $(seq 1 100); do
    ready=0
    for id in 1 2 3; do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + 1 + 10 * id))/readyz" || true)" = 200 ] && ready=$((ready + 1))
    done
    [ "$ready" = 3 ] && break
    sleep 0.1
  done
  "$bench" --url "http://127.0.0.1:$((base + 10))" --label "$label" --prefix "/reads-$label-$base/s" \
    catch-up --bytes "$bytes" --size "$size" --readers "$readers" | tee -a "$results"
  for p in "${round_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

base=5800
for round in $(seq 1 "$rounds"); do
  for label in a b b a; do
    bin="$a"; [ "$label" = b ] && bin="$b"
    run_round "$label" "$bin" "$base"
    base=$((base + 40))
  done
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
def med(label, key):
    return statistics.median(r[key] for r in rows if r.get("label") == label)
keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
for key in keys:
    a, b = med("a", key), med("b", key)
    print(f"{key:28} a {a:12.2f}   b {b:12.2f}   b/a {b / a if a else float('nan'):6.3f}")
PY
