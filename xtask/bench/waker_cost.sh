#!/bin/bash
# Waker tracking's in-kernel cost (BENCHMARKS.md, part e2): per-program BPF
# run time (kernel.bpf_stats_enabled) while the dispatch bench fixture runs
# under two profiler binaries, alternately, twice each.
#   usage (root, from the workspace, after `cargo xtask bench --only dispatch`
#   built the fixture): xtask/bench/waker_cost.sh BASE_PROFILER NEW_PROFILER
# It turns bpf_stats on for the run and back off at the end.
set -u
BASE=$1 NEW=$2
FX=${FX:-target/xtask/bench/dispatch-nop}
N=${N:-1000000}
run() {
  local bin=$1 tag=$2
  rm -f /tmp/ab_in; mkfifo /tmp/ab_in
  (sleep 120 > /tmp/ab_in &)
  $FX $N < /tmp/ab_in > /tmp/ab_out 2>&1 &
  local fx=$!
  sleep 0.3
  $bin record --pid $fx --dispatch dispatch_message --func handle_fast --trace-events 0 --out /tmp/ab_prof_$tag > /tmp/ab_log 2>&1 &
  local pr=$!
  for i in $(seq 100); do grep -q attached /tmp/ab_log && break; sleep 0.1; done
  echo go > /tmp/ab_in
  sleep 1.5
  python3 - $pr $tag $N <<'PY'
import json, os, subprocess, sys
pid, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = set()
for fd in os.listdir(f"/proc/{pid}/fdinfo"):
    try:
        for l in open(f"/proc/{pid}/fdinfo/{fd}"):
            if l.startswith("prog_id:"):
                ids.add(int(l.split()[1]))
    except OSError:
        pass
tot = {}
for i in sorted(ids):
    p = json.loads(subprocess.run(["bpftool", "prog", "show", "id", str(i), "-j"], capture_output=True, text=True).stdout)
    name = p.get("name")
    t, c = tot.get(name, (0, 0))
    tot[name] = (t + p.get("run_time_ns", 0), c + p.get("run_cnt", 0))
all_ns = 0
for name, (t, c) in sorted(tot.items()):
    all_ns += t
    print(f"{tag} {name:20} runs {c:9} ns/run {t / max(c, 1):8.1f} total {t / 1e6:8.2f} ms")
d = tot.get("prof_entry", (0, 0))[1] / 2
print(f"{tag} all programs: {all_ns / max(d, 1):.1f} ns per dispatch ({d:.0f} dispatches so far)")
PY
  for i in $(seq 600); do grep -q result /tmp/ab_out && break; sleep 0.1; done
  kill -INT $pr; wait $pr
  kill $fx 2>/dev/null; wait $fx 2>/dev/null
}
sysctl -q -w kernel.bpf_stats_enabled=1
trap 'sysctl -q -w kernel.bpf_stats_enabled=0' EXIT
run "$BASE" base
run "$NEW" new
run "$BASE" base
run "$NEW" new
