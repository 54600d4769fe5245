#!/usr/bin/env bash
# Replication under load, on loopback: a real nats-server and N `suffixd serve` replicas
# (default 3) of one cluster; tools/load.py drives the first, the others follow. Then an
# empty replica boots from a snapshot the first publishes, and a namespace eviction on
# the last one is awaited on all.
#
#   tools/replication-lag.sh [--replicas 3] [--requests 128] [--concurrency 32]
#                            [--max-tokens 32] [--bin target/release/suffixd]
#
# Prints, per replica: cached tokens, applied records and the replication lag (append at
# the origin to apply here) p50/p99 over the last 1,024; the time for all to report the
# same cached tokens after the load ends; the empty replica's boot time. Exits non-zero
# when the replicas do not converge within 60 s. Needs nats-server (tools/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

replicas=3 requests=128 concurrency=32 max_tokens=32 bin=target/release/suffixd
while [ $# -gt 0 ]; do
    case "$1" in
        --replicas) replicas=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --concurrency) concurrency=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "build first: cargo build --release ($bin missing)" >&2; exit 2; }
command -v nats-server >/dev/null || { echo "nats-server missing: run tools/setup.sh" >&2; exit 2; }

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait "${pids[@]}" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
token=lag-test
nats_port=$(free_port)
nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >/dev/null 2>&1 &
pids+=($!)
export SUFFIXD_ADMIN_TOKEN=$token CANDLE_NUM_THREADS=${CANDLE_NUM_THREADS:-2}

ports=()
start_replica() { # name: appends its port to ports[] once it answers
    local name=$1 port
    port=$(free_port)
    "$bin" serve --addr "127.0.0.1:$port" --snapshot-dir "$work/$name" \
        --replicate "nats://127.0.0.1:$nats_port" --cluster lag \
        >"$work/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && { ports+=("$port"); return; }
        sleep 0.2
    done
    echo "replica $name did not start: $(tail -5 "$work/$name.log")" >&2
    exit 1
}
since() { python3 -c 'import sys, time; print(time.time() - float(sys.argv[1]))' "$1"; }
stats() { curl -sf -H "authorization: Bearer $token" "http://127.0.0.1:$1/admin/stats"; }

for i in $(seq "$replicas"); do start_replica "r$i"; done
echo "replicas on ports ${ports[*]}, nats on $nats_port"

python3 tools/load.py --base "http://127.0.0.1:${ports[0]}" --requests "$requests" \
    --concurrency "$concurrency" --max-tokens "$max_tokens"

# Waits (60 s at most) until every replica reports the same cached tokens (or, with
# "empty", none); prints the seconds it waited. One process polls all, every 20 ms.
await_all() {
    python3 - "$1" "$token" "${ports[@]}" <<'PY'
import json, sys, time, urllib.request
want, token, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
def cached(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/stats",
                                 headers={"authorization": f"Bearer {token}"})
    return json.load(urllib.request.urlopen(req))["cached_tokens"]
t0 = time.monotonic()
while time.monotonic() - t0 < 60:
    seen = {cached(p) for p in ports}
    if (want == "same" and len(seen) == 1) or (want == "empty" and seen == {0}):
        print("%.2f" % (time.monotonic() - t0))
        sys.exit(0)
    time.sleep(0.02)
sys.exit(1)
PY
}
waited=$(await_all same) || { echo "the replicas did not converge within 60 s" >&2; exit 1; }
echo "all $replicas replicas reported the same cached tokens ${waited} s after the load ended"
for i in "${!ports[@]}"; do
    stats "${ports[$i]}" | python3 -c '
import json, sys
s = json.load(sys.stdin); r = s["replication"]
print("r%s: cached_tokens %d, published %d, applied %d, lag p50 %.1f ms, p99 %.1f ms, refused %d, missed %d" % (
    sys.argv[1], s["cached_tokens"], r["published"], r["applied"],
    r["lag_seconds_p50"] * 1e3, r["lag_seconds_p99"] * 1e3, r["refused"], r["missed"]))' "$((i + 1))"
done

# An empty replica boots from r1's published snapshot.
curl -sf -X POST -H "authorization: Bearer $token" "http://127.0.0.1:${ports[0]}/admin/snapshot" >/dev/null
for _ in $(seq 600); do
    stats "${ports[0]}" | python3 -c 'import json,sys; sys.exit(json.load(sys.stdin)["replication"]["snapshots_published"] < 1)' && break
    sleep 0.1
done
t0=$(date +%s.%N)
start_replica empty
printf 'an empty replica answered %.2f s after it started, from %s\n' \
    "$(since "$t0")" \
    "$(stats "${ports[-1]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["replication"]["snapshot_fetched"])')"
await_all same >/dev/null || { echo "the empty replica did not converge within 60 s" >&2; exit 1; }
echo "and it reports the same cached tokens as the others"

# A namespace evicted on the last replica empties it on all.
t0=$(date +%s.%N)
curl -sf -X POST -H "authorization: Bearer $token" -H 'content-type: application/json' \
    -d '{"namespace": "default"}' "http://127.0.0.1:${ports[-1]}/admin/evict" >/dev/null
answered=$(since "$t0")
waited=$(await_all empty) || { echo "the eviction did not reach every replica within 60 s" >&2; exit 1; }
printf 'namespace default evicted on the last replica (answered in %.2f s): empty on all %d %s s later\n' \
    "$answered" "${#ports[@]}" "$waited"
