#!/usr/bin/env bash
# Lease takeover after SIGKILL: two daemons share a fresh database on a PostgreSQL
# server with 8 streams to read; once daemon `a` holds leases, it is killed with
# SIGKILL, and the time until daemon `b` holds every stream `a` held is measured
# (polling the leases every 50 ms). Each trial has a database of its own.
#
#   docs/benchmarks/postgres/takeover.sh MEMCTL SERVER_URL LEASE_SECONDS [TRIALS]
#   e.g. takeover.sh target/release/memctl postgres://memagent@127.0.0.1:5432/postgres 2 3
set -euo pipefail
memctl="$(realpath "$1")"; server="$2"; lease="$3"; trials="${4:-3}"
root="$(mktemp -d)"
db=""
cleanup() {
  kill -9 $(jobs -p) 2>/dev/null || true
  [[ -n "$db" ]] && psql "$server" -qc "drop database if exists $db with (force)" >/dev/null 2>&1
  rm -rf "$root"
}
trap cleanup EXIT
now() { date +%s.%N; }
live="expires_at > (extract(epoch from clock_timestamp()) * 1000)::bigint"
for trial in $(seq "$trials"); do
  db="takeover_$$_$trial"
  psql "$server" -qc "create database $db"
  url="${server%/*}/$db"
  dir="$root/$trial"
  mkdir -p "$dir"
  printf 'database = "%s"\n' "$url" > "$dir/config.toml"
  q() { psql "$url" -Atqc "$1"; }
  for i in $(seq 8); do
    for j in $(seq 300); do echo "Stream $i note $j: shelf $j holds $((i * j)) lamps."; done > "$dir/s.txt"
    "$memctl" --config "$dir/config.toml" --data-dir "$dir/appender" ingest "s$i" "$dir/s.txt" --no-process >/dev/null
  done
  for name in a b; do
    # memctl itself in the background (not a subshell): $! is its pid.
    "$memctl" --config "$dir/config.toml" --data-dir "$dir/$name" --embedder none daemon run \
      --name "$name" --lease-seconds "$lease" --chunk-tokens 64 --memory-tokens 24 \
      --idle-seconds 0.5 2>>"$dir/$name.log" &
    echo $! > "$dir/$name.pid"
    until "$memctl" --data-dir "$dir/$name" daemon status >/dev/null 2>&1; do sleep 0.1; done
  done
  until [[ "$(q "select count(*) from leases where owner = 'a' and $live")" -gt 0 ]]; do sleep 0.05; done
  held="$(q "select string_agg(stream_id::text, ',') from leases where owner = 'a' and $live")"
  kill -9 "$(cat "$dir/a.pid")"; t0="$(now)"
  n="$(echo "$held" | tr ',' '\n' | wc -l)"
  until [[ "$(q "select count(*) from leases where owner = 'b' and stream_id in ($held) and $live")" == "$n" ]]; do sleep 0.05; done
  t1="$(now)"
  echo "trial $trial: lease ${lease}s, $n streams of a taken over by b after $(echo "$t1 - $t0" | bc) s"
  kill "$(cat "$dir/b.pid")"; wait "$(cat "$dir/b.pid")" 2>/dev/null || true
  psql "$server" -qc "drop database $db with (force)"; db=""
done
