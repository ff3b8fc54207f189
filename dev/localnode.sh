#!/usr/bin/env bash
# Starts or stops the local node (dev/localnode): the kubelet stand-in that
# runs the dev cluster's pods as real local processes. Needs root (network
# and mount namespaces).
#
#   dev/localnode.sh start    build if needed, start in the background, wait
#                             until Node/localnode is Ready. Idempotent.
#   dev/localnode.sh stop     stop it; afterwards no pod process, network
#                             namespace, veth, bridge or mount of it is left.
#                             Idempotent.
#   dev/localnode.sh status   running or not.
#
# State under .dev/localnode/: localnode.log, localnode.pid, pods/<ns>_<pod>/
# (container logs <container>.log), volumes/ (PV data).
# Environment: KUBECONFIG (default .dev/kubeconfig), LOCALNODE_CPU (CPUs to
# advertise, default 8: the dev cluster over-commits this 2-core machine),
# LOCALNODE_MEMORY_MIB (default: the host's), RUST_LOG.
# A second, independent node (used by the teardown test): LOCALNODE_NAME,
# LOCALNODE_STATE (state directory), LOCALNODE_PREFIX (host object prefix,
# default rp), LOCALNODE_POD_NETWORK (default 10.244.0.1/16),
# LOCALNODE_PROVISIONER (default true; one provisioner per cluster),
# LOCALNODE_UNSCHEDULABLE (set: only pods naming the node in spec.nodeName).
# The kubelet API (pod logs, for kubectl logs): LOCALNODE_KUBELET_ADDRESS
# (default 127.0.0.1), LOCALNODE_KUBELET_PORT (default 10250; a second node
# finding it taken picks a free port and advertises that one).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state=${LOCALNODE_STATE:-$root/.dev/localnode}
pidfile=$state/localnode.pid
log=$state/localnode.log
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/debug/localnode
kubeconfig=${KUBECONFIG:-$root/.dev/kubeconfig}
node=${LOCALNODE_NAME:-localnode}
prefix=${LOCALNODE_PREFIX:-rp}

running() {
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null &&
		grep -q localnode "/proc/$(cat "$pidfile")/cmdline" 2>/dev/null
}

kubectl() {
	local k=$root/bin/kubectl
	[[ -x $k ]] || k=kubectl
	"$k" --kubeconfig "$kubeconfig" "$@"
}

start() {
	if [[ $(id -u) != 0 ]]; then
		echo "localnode: needs root (network and mount namespaces)" >&2
		exit 1
	fi
	mkdir -p "$state"
	if running; then
		echo "localnode: already running (pid $(cat "$pidfile"))"
	else
		# LOCALNODE_NO_BUILD=1 uses the binary as it is (tests run under cargo).
		if [[ -z ${LOCALNODE_NO_BUILD:-} || ! -x $bin ]]; then
			(cd "$root" && cargo build --quiet -p redpilot-localnode)
		fi
		local args=(run --kubeconfig "$kubeconfig" --repo "$root" --state-dir "$state"
			--images "$root/dev/images.yaml" --node-name "$node" --cpu "${LOCALNODE_CPU:-8}"
			--instance-prefix "$prefix" --pod-network "${LOCALNODE_POD_NETWORK:-10.244.0.1/16}"
			--provisioner "${LOCALNODE_PROVISIONER:-true}"
			--kubelet-address "${LOCALNODE_KUBELET_ADDRESS:-127.0.0.1}" --kubelet-port "${LOCALNODE_KUBELET_PORT:-10250}")
		[[ -n ${LOCALNODE_MEMORY_MIB:-} ]] && args+=(--memory-mib "$LOCALNODE_MEMORY_MIB")
		[[ -n ${LOCALNODE_UNSCHEDULABLE:-} ]] && args+=(--unschedulable)
		cd "$root"
		# The operator's image runs the operator binaries of the same build.
		REDPILOT_IMAGE_BIN=${REDPILOT_IMAGE_BIN:-$target/debug/redpilot} \
			REDPILOT_EXPORTER_BIN=${REDPILOT_EXPORTER_BIN:-$target/debug/redpilot-exporter} \
			RUST_LOG=${RUST_LOG:-info} setsid "$bin" "${args[@]}" >>"$log" 2>&1 </dev/null &
		echo $! >"$pidfile"
		echo "localnode: started (pid $!, log $log)"
	fi
	local i
	for i in $(seq 1 60); do
		# Checked twice: while the process is mid-exec its cmdline reads
		# empty for an instant.
		if ! running && ! { sleep 0.5 && running; }; then
			echo "localnode: exited; last log lines:" >&2
			tail -n 20 "$log" >&2
			exit 1
		fi
		if [[ $(kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; then
			echo "localnode: node/$node Ready"
			return 0
		fi
		sleep 1
	done
	echo "localnode: node/$node not Ready after 60s; see $log" >&2
	exit 1
}

stop() {
	if running; then
		local pid
		pid=$(cat "$pidfile")
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for i in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
	# Belt and braces: whatever a crashed node left behind.
	if [[ -x $bin ]]; then
		"$bin" cleanup --instance-prefix "$prefix" || true
	else
		local ns
		for ns in $(ip netns list 2>/dev/null | awk -v p="^$prefix-" '$0 ~ p {print $1}'); do
			ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
			ip netns del "$ns" 2>/dev/null || true
		done
		ip link del "${prefix}node0" 2>/dev/null || true
	fi
	rm -rf "$state"/pods/*/run-* 2>/dev/null || true
	# Images pulled from a loopback registry are unpacked per digest; a new
	# node pulls them again (each test build's operator image is another).
	rm -rf "$state/images" 2>/dev/null || true
	# Sized volumes (a class with parameters.sized "true") are tmpfs mounts:
	# unmounted, so the state directory can go.
	local vols
	vols=$(readlink -f "$state/volumes" 2>/dev/null || true)
	if [[ -n $vols ]] && command -v findmnt >/dev/null; then
		findmnt -rn -o TARGET | awk -v d="$vols/" 'index($0, d) == 1' | sort -r |
			xargs -r -n1 umount -l 2>/dev/null || true
	fi
	echo "localnode: stopped"
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) if running; then echo "localnode: running (pid $(cat "$pidfile"))"; else echo "localnode: stopped"; exit 1; fi ;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
