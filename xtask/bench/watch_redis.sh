#!/bin/bash
# Usage: start redis-server --port 16379 --save "" first; PROFILER=path/to/profiler bash xtask/bench/watch_redis.sh
# redis throughput unwatched vs watched (interleaved), and the watcher's CPU.
RP=$(pgrep -f "redis-server.*16379")
rb() { redis-benchmark -p 16379 -n 200000 -c 20 -P 1 -t get -q 2>/dev/null | grep -o '[0-9.]* requests per second' | cut -d' ' -f1; }
for round in 1 2 3; do
  a=$(rb)
  ${PROFILER:-target/release/profiler} watch --pid $RP --out /tmp/wb --duration 600s 2>/dev/null & WP=$!
  sleep 4
  c0=$(awk '{print $14+$15}' /proc/$WP/stat); t0=$(date +%s.%N)
  b=$(rb)
  c1=$(awk '{print $14+$15}' /proc/$WP/stat); t1=$(date +%s.%N)
  sleep 10; c2=$(awk '{print $14+$15}' /proc/$WP/stat)
  rss=$(awk '/VmRSS/{print $2}' /proc/$WP/status)
  kill -TERM $WP; wait $WP 2>/dev/null
  echo "round $round unwatched $a watched $b ratio $(echo "$b/$a" | bc -l | cut -c1-5) watcher_cpu_ticks_during_load $((c1-c0)) over $(echo "$t1-$t0" | bc | cut -c1-5)s idle_ticks_10s $((c2-c1)) rss_kb $rss"
done
