#!/usr/bin/env bash
# Watches the dev cluster's API server for stalls while tests run, so a test
# that failed because the machine stood still can be told from one that
# failed on its own.
#
#   hack/stall-watch.sh start   once a second, time a read of one object (the
#                               API server asks etcd for it: a quorum read);
#                               log every read slower than 1 s with the
#                               machine's pressure (PSI) over that second
#   hack/stall-watch.sh report  print what was seen since start
#   hack/stall-watch.sh stop    stop watching (dev/cluster.sh down calls it)
#
# Files: .dev/stalls/ (watch.log: the slow reads; psi.start: PSI at start).
# Cost: one curl process a second (about 5 ms of CPU).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/.dev/stalls
kubeconfig=$root/.dev/kubeconfig
kubectl=$root/bin/kubectl

# "cpu_some io_some io_full mem_full" totals in microseconds (0s without PSI).
psi() {
	local cpu=0 io_some=0 io_full=0 mem=0
	if [[ -r /proc/pressure/io ]]; then
		cpu=$(awk -F'total=' '/^some/ {print $2}' /proc/pressure/cpu)
		io_some=$(awk -F'total=' '/^some/ {print $2}' /proc/pressure/io)
		io_full=$(awk -F'total=' '/^full/ {print $2}' /proc/pressure/io)
		mem=$(awk -F'total=' '/^full/ {print $2}' /proc/pressure/memory)
	fi
	echo "$cpu $io_some $io_full $mem"
}

# Client credentials from the kubeconfig, as files curl reads.
credentials() {
	local k=("$kubectl" --kubeconfig "$kubeconfig" config view --raw --minify -o)
	"${k[@]}" 'jsonpath={.clusters[0].cluster.server}' >"$dir/server"
	local what field
	for what in ca:'{.clusters[0].cluster.certificate-authority' \
		cert:'{.users[0].user.client-certificate' key:'{.users[0].user.client-key'; do
		field=${what#*:}
		local data path
		data=$("${k[@]}" "jsonpath=$field-data}")
		path=$("${k[@]}" "jsonpath=$field}")
		if [[ -n $data ]]; then
			printf '%s' "$data" | base64 -d >"$dir/${what%%:*}.pem"
		elif [[ -n $path ]]; then
			cp "$path" "$dir/${what%%:*}.pem"
		else
			echo "stall-watch: no ${what%%:*} in $kubeconfig" >&2
			return 1
		fi
	done
	chmod 600 "$dir"/*.pem
}

watch() {
	local server before after t0 t1 ms
	server=$(cat "$dir/server")
	before=$(psi)
	while :; do
		t0=$(date +%s%N)
		curl -s -o /dev/null -m 60 --cacert "$dir/ca.pem" --cert "$dir/cert.pem" \
			--key "$dir/key.pem" "$server/api/v1/namespaces/default" || true
		t1=$(date +%s%N)
		after=$(psi)
		ms=$(((t1 - t0) / 1000000))
		echo $((t1 / 1000000000)) >"$dir/last"
		if [[ $ms -ge 1000 ]]; then
			# PSI over the slow read: microseconds of stall in that window.
			read -r c0 is0 if0 m0 <<<"$before"
			read -r c1 is1 if1 m1 <<<"$after"
			printf '%s read took %d ms; PSI over it: cpu some %d ms, io some %d ms, io full %d ms, memory full %d ms\n' \
				"$(date -u -d "@$((t0 / 1000000000))" +%H:%M:%S)" "$ms" \
				$(((c1 - c0) / 1000)) $(((is1 - is0) / 1000)) $(((if1 - if0) / 1000)) $(((m1 - m0) / 1000)) \
				>>"$dir/watch.log"
		fi
		before=$after
		sleep 1
	done
}

start() {
	stop
	mkdir -p "$dir"
	rm -f "$dir/watch.log" "$dir/last"
	credentials
	psi >"$dir/psi.start"
	date +%s >"$dir/started"
	: >"$dir/watch.log"
	nohup bash "$0" watch-loop >/dev/null 2>&1 &
	echo $! >"$dir/pid"
}

stop() {
	if [[ -f $dir/pid ]]; then
		kill "$(cat "$dir/pid")" 2>/dev/null || true
		rm -f "$dir/pid"
	fi
}

report() {
	if [[ ! -f $dir/started ]]; then
		echo "stall watch: not started"
		return 0
	fi
	local secs slow longest
	secs=$(($(date +%s) - $(cat "$dir/started")))
	slow=$(grep -c 'read took' "$dir/watch.log" || true)
	longest=$(awk '{print $4}' "$dir/watch.log" | sort -n | tail -1)
	read -r c0 is0 if0 m0 <"$dir/psi.start"
	read -r c1 is1 if1 m1 <<<"$(psi)"
	echo "stall watch over ${secs} s: ${slow} API reads slower than 1 s (longest ${longest:-0} ms);" \
		"machine PSI: cpu some $(((c1 - c0) / 1000000)) s, io some $(((is1 - is0) / 1000000)) s," \
		"io full $(((if1 - if0) / 1000000)) s, memory full $(((m1 - m0) / 1000000)) s"
	if [[ $slow -gt 0 ]]; then
		sort -t' ' -k4 -n -r "$dir/watch.log" | head -5 | sed 's/^/  slowest: /'
	fi
}

case ${1:-} in
start) start ;;
stop) stop ;;
report) report ;;
watch-loop) watch ;;
*)
	echo "usage: hack/stall-watch.sh start|report|stop" >&2
	exit 2
	;;
esac
