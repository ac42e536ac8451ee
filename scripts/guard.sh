#!/usr/bin/env bash
# The quick guard: tollgate against the best peer on each of its three paths, briefly, as
# ratios, so that a change can be checked before it lands. In process against governor
# (benches/inproc.rs), over HTTP against tower_governor sending its headers too
# (benches/http.rs), on Redis against redis-cell (benches/redis.rs). Short runs on a shared
# machine move with its load: a ratio that moves past its target is a reason to run the
# full benchmark (BENCHMARKS.md), not a verdict.
#
#   scripts/guard.sh                 # all three: builds first, then runs for under two minutes
#   scripts/guard.sh inproc redis    # some of: inproc http redis lease
#
# The Redis part starts its own redis-server (from PATH) and loads redis-cell from
# $TOLLGATE_REDIS_CELL, or from ../redis-cell/target/release/libredis_cell.so (a build of
# redis-cell beside this repository); without the module it says so and is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
if [ ${#parts[@]} -eq 0 ]; then
    parts=(inproc http redis lease)
fi
wants() {
    local p
    for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done
    return 1
}

benches=()
for p in "${parts[@]}"; do
    case "$p" in
        inproc | http | redis | lease) benches+=(--bench "$p") ;;
        *) echo "unknown part '$p' (inproc, http, redis, lease)" >&2; exit 2 ;;
    esac
done
echo "== building ${parts[*]}"
cargo bench -q -p tollgate-bench "${benches[@]}" --no-run
start=$SECONDS

if wants inproc; then
    echo
    echo "== in process: tollgate / governor (ns per decision; target: every row ≤ 1.1×, one thread and two)"
    INPROC_MS=100 INPROC_ROUNDS=5 cargo bench -q -p tollgate-bench --bench inproc
fi

if wants http; then
    echo
    echo "== over HTTP: tollgate / tower_governor with its headers (loopback, 32 connections)"
    # 11 rounds, not 3: the added CPU is a few tenths of a µs over a request's ~9.
    out=$(HTTP_BENCH_SECS=0.4 HTTP_BENCH_ROUNDS=11 HTTP_BENCH_CONNECTIONS=32 \
        HTTP_BENCH_CASES="tollgate, peer IP;tower_governor, peer IP, headers;tollgate, peer IP, 429;tower_governor, peer IP, headers, 429" \
        cargo bench -q -p tollgate-bench --bench http 2>&1)
    echo "$out" | grep -E '^\|( connections|-| [0-9])'
    # Added server CPU per admitted request over the bare app's (target: ≤ 1.2× tower_governor's
    # with its headers), and the 429 path's requests/s (target: ≥ 2×), from the table's columns.
    echo "$out" | awk -F'|' '
        function trim(s) { gsub(/^ +| +$|×|\+/, "", s); return s }
        /^\| [0-9]/ {
            conn = trim($2); name = trim($3); extra[conn, name] = trim($10); vs[conn, name] = trim($8)
            conns[conn] = 1
        }
        END {
            for (c in conns) {
                t = extra[c, "tollgate, peer IP"]; g = extra[c, "tower_governor, peer IP, headers"]
                if (t != "" && g != "" && g + 0 > 0)
                    printf "%s connections: added CPU, admitted: tollgate %s µs, tower_governor %s µs: %.2f×\n", c, t, g, t / g
                else if (t != "")
                    printf "%s connections: added CPU, admitted: tollgate %s µs, tower_governor %s µs\n", c, t, g
                printf "%s connections: requests/s vs tower_governor: admitted %s×, 429 %s×\n", c, vs[c, "tollgate, peer IP"], vs[c, "tollgate, peer IP, 429"]
            }
        }'
fi

if wants redis; then
    echo
    echo "== on Redis: tollgate / redis-cell (one GCRA rule, 1000 keys and one hot key, 16 and 64 tasks)"
    cell=${TOLLGATE_REDIS_CELL:-../redis-cell/target/release/libredis_cell.so}
    if ! command -v redis-server >/dev/null 2>&1 && [ -z "${TOLLGATE_REDIS_SERVER:-}" ]; then
        echo "skipped: no redis-server on PATH (scripts/install-deps.sh installs one)"
    elif [ ! -f "$cell" ]; then
        echo "skipped: no redis-cell module at $cell (build redis-cell and set TOLLGATE_REDIS_CELL)"
    else
        TOLLGATE_REDIS_CELL=$(realpath "$cell") TOLLGATE_BENCH_SECS=0.5 \
            TOLLGATE_BENCH_CONCURRENCY=16,64 TOLLGATE_BENCH_RULES=1 TOLLGATE_BENCH_KEYS=1000,1 \
            cargo bench -q -p tollgate-bench --bench redis | grep -E '^\|( path|-| tollgate| redis-cell)'
        # decisions/s and Redis µs per decision (targets: ≥ 1.0× and ≤ 2.5 µs; on one hot
        # key, where a call's batches fold into one read and one write, ≥ 3×), from the rows
        # the bench writes.
        awk -F, '
            { k = $3 " tasks" ($1 ~ /one key/ ? ", one key" : "") }
            $1 ~ /^tollgate coalesced/ { t[k] = $4; us[k] = $8 }
            $1 ~ /^redis-cell CL.THROTTLE/ { c[k] = $4 }
            END {
                for (k in t) if (c[k] > 0)
                    printf "%s: decisions/s tollgate coalesced / redis-cell: %.2f×; Redis µs per decision %.2f\n", k, t[k] / c[k], us[k]
            }' target/bench-redis.csv
    fi
fi

if wants lease; then
    echo
    echo "== a hot key leased on Redis: 3 instances, one key, against redis-cell (target: ≥ 3×; at"
    echo "   the limit the worst burst a checker sees never above the rule's burst)"
    cell=${TOLLGATE_REDIS_CELL:-../redis-cell/target/release/libredis_cell.so}
    if [ ! -f "$cell" ]; then
        echo "skipped: no redis-cell module at $cell (build redis-cell and set TOLLGATE_REDIS_CELL)"
    else
        out=$(TOLLGATE_REDIS_CELL=$(realpath "$cell") TOLLGATE_BENCH_SECS=0.5 \
            cargo bench -q -p tollgate-bench --bench lease)
        echo "$out" | grep -E '^(3 instances|tollgate|redis-cell)'
        # Per tasks per instance: far under the limit, leased / redis-cell and Redis calls
        # per 1,000 decisions; at it, the worst burst the checker is certain of.
        echo "$out" | awk '
            /^3 instances x/ { tasks = $4; far = ($0 ~ /far under/) }
            $1 == "tollgate" && $2 == "leased" && far { t[tasks] = $3; calls[tasks] = $5 }
            $1 == "tollgate" && $2 == "leased" && !far {
                for (i = 1; i <= NF; i++) if ($i == "certain") { b[tasks] = $(i + 1); sub(",", "", b[tasks]) }
            }
            $1 == "redis-cell" && far { c[tasks] = $2 }
            END {
                for (k in t) if (c[k] > 0)
                    printf "%s tasks: leased / redis-cell %.1f×, %s Redis calls per 1,000; worst burst at the limit %s (burst 1000)\n", k, t[k] / c[k], calls[k], b[k]
            }'
    fi
fi

echo
echo "== ran for $((SECONDS - start)) s"
