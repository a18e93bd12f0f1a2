# CPU quota for the GPU-like rig (sourced by scripts/rig-gpu and scripts/truth).
# A cgroup whose processes together get SHARE of one core: cgroup v2's
# cpu.max where a v2 hierarchy has the cpu controller, else v1's
# cpu.cfs_quota_us. The period is 10 ms, not the kernel's 100 ms: at 100 ms a
# throttled process runs 30 ms and then waits 70, so single-token timings
# (tens of ms) come out lumpy; at 10 ms each token sees many periods.
#   quota_create SHARE     sets $quota_dir (exits 2 with the reason if neither works)
#   quota_run CMD ARGS...  runs CMD inside the quota (its children too)
#   quota_remove           moves nothing, removes the cgroup once it is empty
quota_period_us=10000

quota_create() {
  local share=$1 us v2 v1
  us=$(python3 -c "import sys; s=float(sys.argv[1]); assert 0 < s <= 64; print(max(1000, int(s * $quota_period_us)))" "$share") || {
    echo "quota: share '$share' is not a number of cores in (0, 64]; pass e.g. 0.3" >&2; exit 2; }
  v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
  v1=$(awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/mounts)
  quota_dir=
  if [ -n "$v2" ] && grep -qw cpu "$v2/cgroup.controllers" 2>/dev/null; then
    grep -qw cpu "$v2/cgroup.subtree_control" 2>/dev/null || echo +cpu > "$v2/cgroup.subtree_control" 2>/dev/null || true
    if mkdir -p "$v2/ngl-tune-rig.$$" 2>/dev/null && echo "$us $quota_period_us" > "$v2/ngl-tune-rig.$$/cpu.max" 2>/dev/null; then
      quota_dir="$v2/ngl-tune-rig.$$"
      quota_kind="cgroup v2 cpu.max = $us $quota_period_us"
    else
      rmdir "$v2/ngl-tune-rig.$$" 2>/dev/null || true
    fi
  fi
  if [ -z "$quota_dir" ] && [ -n "$v1" ]; then
    if mkdir -p "$v1/ngl-tune-rig.$$" 2>/dev/null &&
       echo "$quota_period_us" > "$v1/ngl-tune-rig.$$/cpu.cfs_period_us" 2>/dev/null &&
       echo "$us" > "$v1/ngl-tune-rig.$$/cpu.cfs_quota_us" 2>/dev/null; then
      quota_dir="$v1/ngl-tune-rig.$$"
      quota_kind="cgroup v1 cpu.cfs_quota_us = $us per $quota_period_us us"
    else
      rmdir "$v1/ngl-tune-rig.$$" 2>/dev/null || true
    fi
  fi
  if [ -z "$quota_dir" ]; then
    echo "quota: no writable CPU controller (cgroup v2 ${v2:-not mounted}, v1 ${v1:-not mounted}): run as root on a machine with cgroups, or without the quota" >&2
    exit 2
  fi
}

quota_run() {
  ( echo "$BASHPID" > "$quota_dir/cgroup.procs" && exec "$@" )
}

quota_remove() {
  [ -n "${quota_dir:-}" ] && [ -d "$quota_dir" ] || return 0
  for _ in $(seq 1 50); do rmdir "$quota_dir" 2>/dev/null && return 0; sleep 0.1; done
  echo "quota: $quota_dir still has processes; remove it with rmdir once they end" >&2
}
