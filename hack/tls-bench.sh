#!/usr/bin/env bash
# TLS measurements (make bench-tls) on the test ground's Redis 7.0 (the one
# engine here built with TLS), on loopback, same server settings both ways:
#   1. SET and GET through TLS and in plain text (redis-benchmark: requests
#      per second, p50 and p99 in ms), BENCH_CLIENTS clients, BENCH_REQUESTS
#      requests of BENCH_VALUE bytes;
#   2. a replica's first full sync of BENCH_SYNC_MB MiB over TLS and plain;
#   3. the cost of a live certificate reload: the time of the CONFIG SET that
#      makes the server read new files, and GET p99 while a reload runs every
#      200 ms (against GET p99 without).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
server=$root/bin/engines/redis-7.0
rcli=$root/bin/engines/redis-cli
for b in "$server" "$rcli" redis-benchmark openssl; do
	if ! command -v "$b" >/dev/null 2>&1 && [[ ! -x $b ]]; then
		echo "bench-tls: $b is missing (make engines; apt-get install -y redis-tools openssl)" >&2
		exit 1
	fi
done
clients=${BENCH_CLIENTS:-50}
requests=${BENCH_REQUESTS:-200000}
value=${BENCH_VALUE:-64}
sync_mb=${BENCH_SYNC_MB:-256}

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# A CA and two server certificates (the second for the reload).
cert() {
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
		-keyout "$work/$1.key" -out "$work/$1.csr" 2>/dev/null
	openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
		-days 2 -out "$work/$1.crt" \
		-extfile <(printf 'subjectAltName=IP:127.0.0.1') 2>/dev/null
}
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=bench CA" \
	-days 2 -keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null
cert a
cert b
cp "$work/a.crt" "$work/server.crt"
cp "$work/a.key" "$work/server.key"

port=$((20000 + RANDOM % 20000))
start() { # name port tls(0/1) [extra args...]
	local name=$1 p=$2 tls=$3
	shift 3
	local args=(--dir "$work" --dbfilename "$name.rdb" --save "" --appendonly no --daemonize no
		--logfile "$work/$name.log" --protected-mode no --bind 127.0.0.1
		--enable-debug-command yes --repl-diskless-sync-delay 0)
	if [[ $tls == 1 ]]; then
		args+=(--port 0 --tls-port "$p" --tls-cert-file "$work/server.crt" --tls-key-file "$work/server.key"
			--tls-ca-cert-file "$work/ca.crt" --tls-auth-clients no --tls-replication yes)
	else
		args+=(--port "$p")
	fi
	"$server" "${args[@]}" "$@" &
	pids+=($!)
	for _ in $(seq 1 100); do
		cli "$tls" "$p" ping >/dev/null 2>&1 && return
		sleep 0.05
	done
	echo "bench-tls: $name did not start; its log:" >&2
	cat "$work/$name.log" >&2
	exit 1
}
cli() { # tls port args...
	local tls=$1 p=$2
	shift 2
	if [[ $tls == 1 ]]; then
		"$rcli" --tls --cacert "$work/ca.crt" -h 127.0.0.1 -p "$p" "$@"
	else
		"$rcli" -h 127.0.0.1 -p "$p" "$@"
	fi
}
bench() { # tls port tests
	local tls=$1 p=$2 t=$3 extra=()
	[[ $tls == 1 ]] && extra=(--tls --cacert "$work/ca.crt")
	redis-benchmark -h 127.0.0.1 -p "$p" "${extra[@]}" -c "$clients" -n "$requests" -d "$value" \
		-r 100000 -t "$t" --csv 2>/dev/null | tail -n +2 | tr -d '"'
}

plain=$port
tls=$((port + 1))
start plain "$plain" 0
start tls "$tls" 1
echo "== 1. SET/GET, $clients clients, $requests requests of $value bytes (redis-benchmark, loopback)"
printf '%-6s %-5s %12s %8s %8s\n' mode test "req/s" "p50 ms" "p99 ms"
for mode in plain tls; do
	p=${!mode}
	t=0
	[[ $mode == tls ]] && t=1
	while IFS=, read -r test rps _avg _min p50 _p95 p99 _max; do
		printf '%-6s %-5s %12s %8s %8s\n' "$mode" "$test" "$rps" "$p50" "$p99"
	done < <(bench "$t" "$p" set,get)
done

echo "== 2. a replica's full sync of $sync_mb MiB"
for mode in plain tls; do
	p=${!mode}
	t=0
	[[ $mode == tls ]] && t=1
	cli "$t" "$p" flushall >/dev/null
	[[ $(cli "$t" "$p" debug populate "$((sync_mb * 1024))" k 1024) == OK ]] || {
		echo "bench-tls: DEBUG POPULATE failed" >&2
		exit 1
	}
	rp=$((p + 10))
	start "replica-$mode" "$rp" "$t"
	began=$(date +%s%N)
	cli "$t" "$rp" replicaof 127.0.0.1 "$p" >/dev/null
	while :; do
		info=$(cli "$t" "$rp" info replication | tr -d '\r')
		if grep -qx 'master_link_status:up' <<<"$info" && grep -qx 'master_sync_in_progress:0' <<<"$info"; then
			break
		fi
		sleep 0.02
	done
	ms=$((($(date +%s%N) - began) / 1000000))
	keys=$(cli "$t" "$rp" dbsize)
	printf '%-6s %6d ms for %s keys (%s MiB of values)\n' "$mode" "$ms" "$keys" "$sync_mb"
	cli "$t" "$p" flushall >/dev/null
done

echo "== 3. a live certificate reload (CONFIG SET of the three files)"
reload() {
	cli 1 "$tls" config set tls-cert-file "$work/server.crt" tls-key-file "$work/server.key" \
		tls-ca-cert-file "$work/ca.crt" >/dev/null
}
cli 1 "$tls" debug populate 100000 key 64 >/dev/null
cp "$work/b.crt" "$work/server.crt"
cp "$work/b.key" "$work/server.key"
best=
for _ in $(seq 1 20); do
	b=$(date +%s%N)
	reload
	t=$((($(date +%s%N) - b) / 1000))
	[[ -z $best || $t -lt $best ]] && best=$t
done
echo "one reload, redis-cli included (best of 20): $best us"
quiet=$(bench 1 "$tls" get | awk -F, '{print $7}')
(while :; do reload; sleep 0.2; done) &
loop=$!
busy=$(bench 1 "$tls" get | awk -F, '{print $7}')
kill "$loop" 2>/dev/null || true
wait "$loop" 2>/dev/null || true
echo "GET p99 over TLS: $quiet ms without reloads, $busy ms with a reload every 200 ms"
