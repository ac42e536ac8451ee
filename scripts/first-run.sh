#!/usr/bin/env bash
# What a newcomer waits for: a fresh clone of this repository's HEAD, an empty target
# directory, `cargo run --example quickstart`, and the seconds until the server's first
# response. With `--from-nothing`, an empty Cargo home too (the index and every crate
# downloaded). The load average is printed before and after: the figure is a quiet
# machine's only when the load stays near 0. Everything it creates is removed at the end.
#
#   scripts/first-run.sh [--from-nothing]
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -- "-$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

git clone -q --no-local . "$work/clone"
export CARGO_TARGET_DIR="$work/target"
if [ "${1:-}" = --from-nothing ]; then export CARGO_HOME="$work/cargo-home"; fi
port=${PORT:-3917}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s.%N)
# A process group of its own, so that the cleanup stops cargo and the example together.
(cd "$work/clone" && unset REDIS_URL && PORT=$port exec setsid cargo run --example quickstart) \
  >"$work/log" 2>&1 &
pid=$!
until curl -sf -o /dev/null "http://127.0.0.1:$port/"; do
  kill -0 "$pid" 2>/dev/null || { cat "$work/log"; echo "the example stopped"; exit 1; }
  sleep 0.2
done
end=$(date +%s.%N)
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "crates compiled: $(grep -c '^ *Compiling ' "$work/log")"
echo "crates downloaded: $(grep -cE '^ *Downloaded [^ ]+ v[0-9]' "$work/log" || true)"
echo "first response after $(awk "BEGIN { printf \"%.0f\", $end - $start }") s"
