#!/usr/bin/env bash
# Growing a 3-voter cluster to 5 under the standard append load (100 streams in 16 buckets,
# 32 writers, 256 B; mutual TLS, fsync on every voter), on loopback.
#
# Rounds alternate: a steady round measures the 3 voters for --duration; a change round starts
# the same load on a fresh cluster and, once its warm-up is over, grows it to 5 voters (start
# voters 4 and 5 with raft.join, add each as a learner, wait until it has caught up, promote
# it), timing each step. The change round's window is --duration too: what is left of it after
# the growth is measured on 5 voters, which on one machine share the same cores (so the ratio
# is, if anything, low).
#
# Usage: e2e/bench/membership.sh [--rounds 2] [--duration 10s] [--node BIN]
# Prints one JSON line per measurement and per step, then the medians and the ratio
# change/steady of appends/s, and the change rounds' p99.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=2
duration=10s
node=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --node) node="$(realpath "$2")"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build --release --locked -p ursula-node -p ursula-bench
node="${node:-$root/target/release/ursula-node}"
bench="$root/target/release/ursula-bench"
# shellcheck source=processes.sh
source "$root/e2e/bench/processes.sh"
"$node" issue-certs --dir "$work/tls" --nodes 1,2,3,4,5 >/dev/null
results="$work/results.jsonl"

# Voter ID's client port in round R; admin +1, cluster +2.
port() { echo $((4900 + 100 * ($1 % 2) + 10 * $2)); }

peer() {
  local p; p="$(port "$1" "$2")"
  printf '[[raft.peers]]\nid = %s\ncluster_url = "https://127.0.0.1:%s"\nclient_url = "http://127.0.0.1:%s"\n' "$2" $((p + 2)) "$p"
}

# start_voter ROUND ID JOIN: voter ID of round ROUND's cluster; a joining voter lists all five.
start_voter() {
  local round="$1" id="$2" join="$3" p peers="" last=3 dir="$work/r$1"
  p="$(port "$round" "$id")"
  [ "$join" = 1 ] && last=5
  for other in $(seq 1 "$last"); do peers+="$(peer "$round" "$other")"$'\n'; done
  mkdir -p "$dir"
  printf 'node_id = %s\ndata_dir = "%s/node-%s"\n[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\ncluster_listen = "127.0.0.1:%s"\ncluster_tls = { ca_file = "%s/tls/ca.pem", cert_file = "%s/tls/node-%s.pem", key_file = "%s/tls/node-%s.key" }\n[runtime]\nworker_threads = 1\n[raft]\ngroup_count = 16\n%s%s' \
    "$id" "$dir" "$id" "$p" $((p + 1)) $((p + 2)) "$work" "$work" "$id" "$work" "$id" \
    "$([ "$join" = 1 ] && echo 'join = true')"$'\n' "$peers" >"$dir/node-$id.toml"
  "$node" --config "$dir/node-$id.toml" 2>"$dir/node-$id.log" &
  pids+=($!)
  round_pids+="${round_pids:+,}$!"
}

wait_ready() {
  local round="$1"
  for _ in $(seq 1 200); do
    local ready=0
    for id in 1 2 3; do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(($(port "$round" "$id") + 1))/readyz" || true)" = 200 ] && ready=$((ready + 1))
    done
    [ "$ready" = 3 ] && return
    sleep 0.1
  done
  echo "round $round: the voters did not become ready" >&2
  exit 1
}

admin() { # ROUND METHOD PATH [BODY]: through voter 1's admin API; prints the answer
  curl -s -X "$2" "http://127.0.0.1:$(($(port "$1" 1) + 1))$3" ${4:+-H 'content-type: application/json' -d "$4"}
}

# The largest lag of learner ID over every group, as the groups' leaders report it.
learner_lag() {
  local round="$1" id="$2" reports=""
  for voter in 1 2 3 4 5; do
    reports+="$(curl -s "http://127.0.0.1:$(($(port "$round" "$voter") + 1))/admin/membership" || true)"$'\n'
  done
  python3 -c '
import json, sys
learner, groups = int(sys.argv[1]), {}
for line in sys.stdin:
    try:
        report = json.loads(line)
    except ValueError:
        continue
    for group in report["groups"]:
        if group["leader"] == report["node"]:
            # A member that acknowledged nothing yet lags by u64::MAX; bash counts to 2^63.
            groups[group["group"]] = min(group["lag"].get(str(learner), 1 << 62), 1 << 62)
print(max(groups.values()) if len(groups) == 16 else 1 << 62)' "$id" <<<"$reports"
}

appends() { # ROUND: appends voter 1 has applied (every append, whichever group leads it)
  curl -s "http://127.0.0.1:$(($(port "$1" 1) + 1))/metrics" | awk '$1 == "ursula_appends_total" {print int($2)}'
}

window() { # ROUND LABEL APPENDS_BEFORE START_NS: the append rate since then
  local now a; now="$(date +%s%N)"; a="$(appends "$1")"
  echo "{\"bench\":\"window\",\"round\":$1,\"label\":\"$2\",\"appends_per_sec\":$(( (a - $3) * 1000000000 / (now - $4) ))}" | tee -a "$results"
}

step() { # ROUND NAME START_NS
  local now; now="$(date +%s%N)"
  echo "{\"bench\":\"membership-step\",\"round\":$1,\"step\":\"$2\",\"ms\":$(((now - $3) / 1000000))}" | tee -a "$results"
}

grow() {
  local round="$1" t
  for id in 4 5; do
    t="$(date +%s%N)"; start_voter "$round" "$id" 1; step "$round" "start voter $id" "$t"
    local p; p="$(port "$round" "$id")"
    t="$(date +%s%N)"
    admin "$round" PUT "/admin/membership/learners/$id" \
      "{\"cluster_url\":\"https://127.0.0.1:$((p + 2))\",\"client_url\":\"http://127.0.0.1:$p\"}" >/dev/null
    step "$round" "add learner $id" "$t"
    t="$(date +%s%N)"
    until [ "$(learner_lag "$round" "$id")" -le 256 ]; do sleep 0.05; done
    step "$round" "learner $id caught up" "$t"
    t="$(date +%s%N)"
    local answer; answer="$(admin "$round" PUT "/admin/membership/voters/$id")"
    case "$answer" in *'"role":"voter"'*) ;; *) echo "promote $id: $answer" >&2; exit 1 ;; esac
    step "$round" "promote $id" "$t"
  done
}

warmup_s=2
for round in $(seq 1 "$rounds"); do
  # ABBA: every other round runs the change first, so that neither gains from its place.
  order="steady change"
  [ $((round % 2)) = 0 ] && order="change steady"
  for kind in $order; do
    r=$((round * 2 + $([ "$kind" = change ] && echo 1 || echo 0)))
    round_pids=""
    for id in 1 2 3; do start_voter "$r" "$id" 0; done
    wait_ready "$r"
    "$bench" --url "http://127.0.0.1:$(port "$r" 1)" --label "$kind" --prefix /bench append \
      --buckets 16 --writers 32 --duration "$duration" --warmup "${warmup_s}s" \
      --server-pids "$round_pids" >>"$results" &
    load=$!
    sleep "$warmup_s"
    a0="$(appends "$r")"; t0="$(date +%s%N)"
    if [ "$kind" = change ]; then
      grow "$r"; step "$r" "3 -> 5 voters" "$t0"
    else
      sleep 4  # about as long as a growth takes
    fi
    window "$r" "$kind" "$a0" "$t0"
    wait "$load"
    tail -n 1 "$results"
    for p in ${round_pids//,/ }; do kill "$p" 2>/dev/null || true; done
    for p in ${round_pids//,/ }; do wait "$p" 2>/dev/null || true; done
  done
done

python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(label, key):
    return statistics.median(r[key] for r in rows if r.get("label") == label and r["bench"] == "append")
def window(label):
    return statistics.median(r["appends_per_sec"] for r in rows if r.get("label") == label and r["bench"] == "window")
steady, change = med("steady", "appends_per_sec"), med("change", "appends_per_sec")
print()
print("append (100 streams in 16 buckets, 32 writers, 256 B, mutual TLS), median of rounds:")
print(f"  3 voters, steady:     {steady:8.0f}/s  p50 {med('steady','p50_ms'):.3f} ms  p99 {med('steady','p99_ms'):.3f} ms")
print(f"  growing 3 -> 5:       {change:8.0f}/s  p50 {med('change','p50_ms'):.3f} ms  p99 {med('change','p99_ms'):.3f} ms")
print(f"  ratio change/steady:  {change / steady:.3f}x  (the change round's window runs on 5 voters once grown)")
w_steady, w_change = window("steady"), window("change")
print(f"during the growth itself (voter 1's ursula_appends_total): steady {w_steady:.0f}/s, growing {w_change:.0f}/s, ratio {w_change / w_steady:.3f}x")
steps = {}
for r in rows:
    if r["bench"] == "membership-step":
        steps.setdefault(r["step"], []).append(r["ms"])
print("steps (median ms): " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in steps.items()))
PY
