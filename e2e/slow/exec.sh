#!/usr/bin/env bash
# Runs a command as if on a slow machine with a slow disk:
#   - in a CPU cgroup of its own, limited to URSULA_SLOW_CPU_PERCENT of one core (default 30);
#     cgroup v1's cpu controller (cpu.cfs_quota_us) or, without it, cgroup v2's cpu.max;
#   - with the slow-disk fault injector preloaded (slow_fsync.c, built by build.sh), which adds
#     URSULA_FAULT_FSYNC_DELAY_MS to every fsync/fdatasync and URSULA_FAULT_FSYNC_STALL_MS to
#     every URSULA_FAULT_FSYNC_STALL_EVERY-th one (defaults below); URSULA_SLOW_DISK=0 leaves
#     the disk alone (a benchmark that gives each process a CPU share of its own, say).
# The command keeps this script's process ID (exec), so a harness can signal it directly.
#
# Usage: e2e/slow/exec.sh NAME COMMAND [ARGS...]   (NAME: the cgroup, unique among those running)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="$1"
shift
percent="${URSULA_SLOW_CPU_PERCENT:-30}"
export URSULA_FAULT_FSYNC_DELAY_MS="${URSULA_FAULT_FSYNC_DELAY_MS:-5}"
export URSULA_FAULT_FSYNC_STALL_MS="${URSULA_FAULT_FSYNC_STALL_MS:-200}"
export URSULA_FAULT_FSYNC_STALL_EVERY="${URSULA_FAULT_FSYNC_STALL_EVERY:-40}"
slow_disk="${URSULA_SLOW_DISK:-1}"
library=""
[ "$slow_disk" = 0 ] || library="$("$here/build.sh")"

if [ -w /sys/fs/cgroup/cpu ] && [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  parent=/sys/fs/cgroup/cpu/ursula-slow
  mkdir -p "$parent"
  limit() { echo 100000 >"$1/cpu.cfs_period_us" && echo $((percent * 1000)) >"$1/cpu.cfs_quota_us"; }
elif [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
  parent=/sys/fs/cgroup/ursula-slow
  mkdir -p "$parent"
  echo +cpu >"$parent/cgroup.subtree_control" 2>/dev/null || true
  limit() { echo "$((percent * 1000)) 100000" >"$1/cpu.max"; }
else
  echo "slow machine: no writable CPU cgroup (v1 /sys/fs/cgroup/cpu or v2 cpu.max); run as root" >&2
  exit 1
fi
# Under a lock, so that a command started at the same time does not take this group for one
# that has ended (empty) and remove it before this process is in it.
exec 9>"/tmp/ursula-slow-cgroups.lock"
flock 9
# Groups of commands that have ended are empty; rmdir refuses the others.
find "$parent" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} + 2>/dev/null || true
mkdir -p "$parent/$name"
limit "$parent/$name"
echo $$ >"$parent/$name/cgroup.procs"
flock -u 9
exec 9>&-
[ -z "$library" ] || export LD_PRELOAD="$library${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"
