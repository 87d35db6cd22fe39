#!/usr/bin/env bash
# Replication benchmark: a 3-voter ursula cluster on loopback (fsync on every voter) against a
# single ursula node of the same build, alternating rounds in one run, same load generator.
# Streams are spread over 16 buckets, so over the cluster's Raft groups; the load generator
# starts at voter 1 and follows 307s to each stream's leader, as a client does.
#
# Usage: e2e/bench/cluster.sh [--rounds N] [--duration 10s] [--writers 32] [--voter-workers 1]
#                             [--buckets 16] [--node BIN] [--raft 'key = value']
#                             [--no-tls | --tls-ab]
#   --node           the ursula-node binary to measure (default: this checkout's release build),
#                    e.g. an older build for an A/B of cluster/single ratios
#   --raft           a line added to each voter's [raft] table (repeatable)
#   --buckets        how many buckets the 100 streams are spread over. A bucket's streams
#                    live in one Raft group: 16 spreads the load over the groups (each group
#                    gets ~2 writers); 1 puts it all on one group (one hot bucket).
#   --voter-workers  each voter's tokio worker threads (`runtime.worker_threads`). Three voters
#                    share this machine's cores; with one worker each, as pods limited to one
#                    CPU would get (tokio sizes its pool from the CPU quota), a voter's tasks
#                    hand work to each other on one thread instead of waking a second one.
#                    0 = tokio's default (one per core).
#   --no-tls         the voters speak plain TCP to each other (for builds before cluster TLS);
#                    by default they use mutual TLS (server.cluster_tls), as in production
#   --tls-ab         instead of the single node, a second 3-voter cluster without TLS: rounds
#                    alternate between the two, and the ratio is TLS/plain
# Prints one JSON line per measurement, then medians, the cluster/single ratio, and fsyncs per
# append (log commits of all voters over appends).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rounds=3
duration=10s
writers=32
voter_workers=1
buckets=16
node=""
raft_extra=""
tls=1
tls_ab=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    --writers) writers="$2"; shift 2 ;;
    --voter-workers) voter_workers="$2"; shift 2 ;;
    --buckets) buckets="$2"; shift 2 ;;
    --node) node="$(realpath "$2")"; shift 2 ;;
    --raft) raft_extra+="$2\n"; shift 2 ;;
    --no-tls) tls=0; shift ;;
    --tls-ab) tls_ab=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cargo build --release --locked -p ursula-node -p ursula-bench
node="${node:-$root/target/release/ursula-node}"
bench="$root/target/release/ursula-bench"
# shellcheck source=processes.sh
source "$root/e2e/bench/processes.sh"

runtime=""
[ "$voter_workers" -gt 0 ] && runtime="[runtime]\nworker_threads = $voter_workers\n"
# start_cluster NAME BASE TLS: three voters with client ports BASE+10, BASE+20, BASE+30 (admin
# +1, cluster +2), with mutual TLS between them when TLS is 1. Sets voter_pids.
start_cluster() {
  local name="$1" base="$2" with_tls="$3" peers="" scheme=http tls_key=""
  voter_pids=""
  if [ "$with_tls" = 1 ]; then
    scheme=https
    "$node" issue-certs --dir "$work/$name-tls" --nodes 1,2,3 >/dev/null
  elif "$node" issue-certs --help >/dev/null 2>&1; then
    # A build with cluster TLS refuses peers without it unless told.
    tls_key="allow_insecure_cluster = true\n"
  fi
  for id in 1 2 3; do
    p=$((base + 10 * id))
    peers+="[[raft.peers]]\nid = $id\ncluster_url = \"$scheme://127.0.0.1:$((p + 2))\"\nclient_url = \"http://127.0.0.1:$p\"\n"
  done
  for id in 1 2 3; do
    p=$((base + 10 * id))
    [ "$with_tls" = 1 ] && tls_key="cluster_tls = { ca_file = \"$work/$name-tls/ca.pem\", cert_file = \"$work/$name-tls/node-$id.pem\", key_file = \"$work/$name-tls/node-$id.key\" }\n"
    printf "node_id = $id\ndata_dir = \"$work/$name-$id\"\n[server]\nlisten = \"127.0.0.1:$p\"\nadmin_listen = \"127.0.0.1:$((p + 1))\"\ncluster_listen = \"127.0.0.1:$((p + 2))\"\n$tls_key$runtime[raft]\ngroup_count = 16\n$raft_extra$peers" \
      >"$work/$name-$id.toml"
    "$node" --config "$work/$name-$id.toml" 2>"$work/$name-$id.log" &
    pids+=($!); voter_pids+="${voter_pids:+,}$!"
  done
  for _ in $(seq 1 100); do
    ready=0
    for id in 1 2 3; do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((base + 1 + 10 * id))/readyz" || true)" = 200 ] && ready=$((ready + 1))
    done
    [ "$ready" = 3 ] && break
    sleep 0.1
  done
}

if [ "$tls_ab" = 1 ]; then
  start_cluster plain 4840 0
  targets=("plain:4850:$voter_pids")
else
  "$node" --data-dir "$work/single" --listen 127.0.0.1:4737 --admin-listen 127.0.0.1:4738 \
    2>"$work/single.log" &
  pids+=($!)
  targets=("single:4737:$!")
fi
start_cluster voter 4740 "$tls"
targets+=("cluster:4750:$voter_pids")

results="$work/results.jsonl"
for round in $(seq 1 "$rounds"); do
  # ABBA: every other round runs the other one first, so that neither gains from its place.
  order=("${targets[@]}")
  [ $((round % 2)) = 0 ] && order=("${targets[1]}" "${targets[0]}")
  for target in "${order[@]}"; do
    IFS=: read -r label port server <<<"$target"
    "$bench" --url "http://127.0.0.1:$port" --label "$label" --prefix /bench append \
      --buckets "$buckets" --writers "$writers" --duration "$duration" --server-pids "$server" \
      | tee -a "$results"
  done
done
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
commits=0
for id in 1 2 3; do
  port=$((4741 + 10 * id))
  count="$(metric "$port" ursula_commit_batches_total)"
  commits=$((commits + ${count%.*}))
done
appends="$(metric 4751 ursula_appends_total)"
echo "{\"bench\":\"fsync\",\"label\":\"cluster\",\"appends\":$appends,\"log_commits_all_voters\":$commits}" | tee -a "$results"

python3 - "$results" "$buckets" "$tls" "$tls_ab" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tls, tls_ab = sys.argv[3] == "1", sys.argv[4] == "1"
def med(label, key):
    vals = [r[key] for r in rows if r["label"] == label and r["bench"] == "append"]
    return statistics.median(vals)
base = "plain" if tls_ab else "single"
s, c = med(base, "appends_per_sec"), med("cluster", "appends_per_sec")
names = {"single": "single node:", "plain": "3 voters, plain:"}
cluster_name = "3 voters, TLS:" if tls else "3 voters, plain:"
print()
print(f"append (100 streams in {sys.argv[2]} buckets, {rows[0]['writers']} writers, 256 B), median of rounds:")
print(f"  {names[base]:18} {s:8.0f}/s  p50 {med(base,'p50_ms'):.3f} ms  p99 {med(base,'p99_ms'):.3f} ms")
print(f"  {cluster_name:18} {c:8.0f}/s  p50 {med('cluster','p50_ms'):.3f} ms  p99 {med('cluster','p99_ms'):.3f} ms")
print(f"  ratio {'TLS/plain' if tls_ab else 'cluster/single'}: {c / s:.3f}x")
print(f"  server CPU per append: {base} {med(base,'server_cpu_us_per_append'):.1f} µs, cluster {med('cluster','server_cpu_us_per_append'):.1f} µs")
f = [x for x in rows if x["bench"] == "fsync"][0]
print(f"cluster fsyncs per append (log commits of all 3 voters / appends): {f['log_commits_all_voters'] / max(f['appends'], 1):.3f}")
PY
