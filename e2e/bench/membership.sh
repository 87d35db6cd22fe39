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
# --cpu-per-voter PERCENT runs each voter in a CPU cgroup of its own, limited to PERCENT of
# one core, and the load in one of --cpu-for-load PERCENT (default 40): each voter then has a
# CPU of its own, as a pod with a CPU limit on a node of its own has, and the new voters do
# not take it from the old ones (as root; `e2e/slow/exec.sh`, without its slow disk).
#
# Usage: e2e/bench/membership.sh [--rounds 2] [--duration 10s] [--node BIN]
#                                [--cpu-per-voter PERCENT [--cpu-for-load PERCENT]]
# Prints one JSON line per measurement and per step (with voter 1's append rate during it),
# then the medians and the ratio change/steady of appends/s, and the change rounds' p99.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=2
duration=10s
node=""
cpu_per_voter=""
cpu_for_load=40
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --node) node="$(realpath "$2")"; shift 2 ;;
    --cpu-per-voter) cpu_per_voter="$2"; shift 2 ;;
    --cpu-for-load) cpu_for_load="$2"; shift 2 ;;
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

# share NAME PERCENT: sets `share` to the words that run a command in a CPU cgroup of its own
# under --cpu-per-voter (none without). Each execs the next, so `$!` is the command's PID.
share() {
  share=()
  [ -z "$cpu_per_voter" ] ||
    share=(env URSULA_SLOW_DISK=0 URSULA_SLOW_CPU_PERCENT="$2" "$root/e2e/slow/exec.sh" "bench-$$-$1")
}

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
  share "r$round-$id" "$cpu_per_voter"
  "${share[@]}" "$node" --config "$dir/node-$id.toml" 2>"$dir/node-$id.log" &
  pids+=($!)
  round_pids+="${round_pids:+,}$!"
}

wait_ready() {
  local round="$1"
  # Up to 60 s: voters held to a CPU share elect 16 groups' leaders slowly.
  for _ in $(seq 1 600); do
    local ready=0
    for id in 1 2 3; do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(($(port "$round" "$id") + 1))/readyz" || true)" = 200 ] && ready=$((ready + 1))
    done
    [ "$ready" = 3 ] && return
    sleep 0.1
  done
  echo "round $round: the voters did not become ready" >&2
  tail -n 5 "$work/r$round"/node-*.log >&2
  exit 1
}

admin() { # ROUND METHOD PATH [BODY]: through voter 1's admin API; prints the answer
  curl -s -X "$2" "http://127.0.0.1:$(($(port "$1" 1) + 1))$3" ${4:+-H 'content-type: application/json' -d "$4"}
}

# Waits until every group's leader reports learner ID at most 256 entries behind. One process
# that asks every 100 ms: a process started per look (curl five times, then python) took
# about 0.8 of a core here (20 looks: 3.7 s of CPU in 4.7 s), from the voters, in the change
# rounds only.
wait_caught_up() {
  local round="$1" id="$2" admins=""
  for voter in 1 2 3 4 5; do admins+="http://127.0.0.1:$(($(port "$round" "$voter") + 1)) "; done
  python3 - "$id" $admins <<'PY'
import json, sys, time, urllib.request
learner, admins = sys.argv[1], sys.argv[2:]
while True:
    lags = {}
    for admin in admins:
        try:
            with urllib.request.urlopen(admin + "/admin/membership", timeout=2) as answer:
                report = json.load(answer)
        except (OSError, ValueError):
            continue
        for group in report["groups"]:
            if group["leader"] == report["node"]:
                # A member that acknowledged nothing yet has no lag to report.
                lags[group["group"]] = group["lag"].get(learner, float("inf"))
    if len(lags) == 16 and max(lags.values()) <= 256:
        break
    time.sleep(0.1)
PY
}

appends() { # ROUND: appends voter 1 has applied (every append, whichever group leads it)
  curl -s "http://127.0.0.1:$(($(port "$1" 1) + 1))/metrics" | awk '$1 == "ursula_appends_total" {print int($2)}'
}

window() { # ROUND LABEL APPENDS_BEFORE START_NS: the append rate since then
  local now a; now="$(date +%s%N)"; a="$(appends "$1")"
  echo "{\"bench\":\"window\",\"round\":$1,\"label\":\"$2\",\"appends_per_sec\":$(( (a - $3) * 1000000000 / (now - $4) ))}" | tee -a "$results"
}

mark() { # the clock and voter 1's appends now, for `step`
  mark_ns="$(date +%s%N)"; mark_appends="$(appends "$1")"
}

step() { # ROUND NAME: how long since `mark` and the append rate meanwhile
  local now a; now="$(date +%s%N)"; a="$(appends "$1")"
  echo "{\"bench\":\"membership-step\",\"round\":$1,\"step\":\"$2\",\"ms\":$(((now - mark_ns) / 1000000)),\"appends_per_sec\":$(( (a - mark_appends) * 1000000000 / (now - mark_ns + 1) ))}" | tee -a "$results"
}

grow() {
  local round="$1"
  for id in 4 5; do
    mark "$round"; start_voter "$round" "$id" 1; step "$round" "start voter $id"
    local p; p="$(port "$round" "$id")"
    mark "$round"
    admin "$round" PUT "/admin/membership/learners/$id" \
      "{\"cluster_url\":\"https://127.0.0.1:$((p + 2))\",\"client_url\":\"http://127.0.0.1:$p\"}" >/dev/null
    step "$round" "add learner $id"
    mark "$round"
    wait_caught_up "$round" "$id"
    step "$round" "learner $id caught up"
    mark "$round"
    local answer; answer="$(admin "$round" PUT "/admin/membership/voters/$id")"
    case "$answer" in *'"role":"voter"'*) ;; *) echo "promote $id: $answer" >&2; exit 1 ;; esac
    step "$round" "promote $id"
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
    share "r$r-load" "$cpu_for_load"
    "${share[@]}" "$bench" --url "http://127.0.0.1:$(port "$r" 1)" --label "$kind" --prefix /bench append \
      --buckets 16 --writers 32 --duration "$duration" --warmup "${warmup_s}s" \
      --server-pids "$round_pids" >>"$results" &
    load=$!
    sleep "$warmup_s"
    a0="$(appends "$r")"; t0="$(date +%s%N)"
    if [ "$kind" = change ]; then
      grow "$r"; mark_ns="$t0"; mark_appends="$a0"; step "$r" "3 -> 5 voters"
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

python3 - "$results" "$cpu_per_voter" "$cpu_for_load" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(label, key):
    return statistics.median(r[key] for r in rows if r.get("label") == label and r["bench"] == "append")
def window(label):
    return statistics.median(r["appends_per_sec"] for r in rows if r.get("label") == label and r["bench"] == "window")
steady, change = med("steady", "appends_per_sec"), med("change", "appends_per_sec")
print()
if sys.argv[2]:
    print(f"each voter in a CPU cgroup of its own at {sys.argv[2]}% of a core, the load at {sys.argv[3]}%")
print("append (100 streams in 16 buckets, 32 writers, 256 B, mutual TLS), median of rounds:")
print(f"  3 voters, steady:     {steady:8.0f}/s  p50 {med('steady','p50_ms'):.3f} ms  p99 {med('steady','p99_ms'):.3f} ms")
print(f"  growing 3 -> 5:       {change:8.0f}/s  p50 {med('change','p50_ms'):.3f} ms  p99 {med('change','p99_ms'):.3f} ms")
print(f"  ratio change/steady:  {change / steady:.3f}x  (the change round's window runs on 5 voters once grown)")
w_steady, w_change = window("steady"), window("change")
print(f"during the growth itself (voter 1's ursula_appends_total): steady {w_steady:.0f}/s, growing {w_change:.0f}/s, ratio {w_change / w_steady:.3f}x")
steps, steps_rate = {}, {}
for r in rows:
    if r["bench"] == "membership-step":
        steps.setdefault(r["step"], []).append(r["ms"])
        steps_rate.setdefault(r["step"], []).append(r["appends_per_sec"])
print("steps (median ms, appends/s meanwhile): " + ", ".join(f"{k} {statistics.median(v):.0f} ({statistics.median(steps_rate[k]):.0f}/s)" for k, v in steps.items()))
PY
