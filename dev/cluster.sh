#!/usr/bin/env bash
# Brings Redpilot's dev cluster up or down.
#
#   dev/cluster.sh up     kwokctl cluster (etcd, kube-apiserver with RBAC and
#                         admission incl. PodSecurity, controller-manager,
#                         scheduler, kwok) from the binaries in bin/, one kwok
#                         fake node, and the local node that runs pods as
#                         real processes. Idempotent.
#   dev/cluster.sh down   stops and deletes all of it; no process is left.
#   dev/cluster.sh status prints whether the cluster answers.
#
# The kubeconfig is written to .dev/kubeconfig. Nothing is downloaded: every
# binary comes from bin/ (make tools).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin
state=$root/.dev
name=${REDPILOT_CLUSTER_NAME:-redpilot}
kubeconfig=$state/kubeconfig
export KWOK_WORKDIR=$state/kwok
export KWOK_KUBECTL_BINARY=$bin/kubectl
# kwokctl reads the Kubernetes version from here for its component flags.
kube_version=$("$bin/kube-apiserver" --version 2>/dev/null | awk '{print $2}' || true)

kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
# etcd's data and the audit log: in memory when /dev/shm is a tmpfs with
# room (a disk busy with the tests' writes once held the API server up long
# enough for controllers to lose their leases), else under .dev.
fast=$state/fast
if [[ -d /dev/shm && -w /dev/shm ]] && [[ $(df -P -k /dev/shm | awk 'NR==2 {print $4}') -gt 2097152 ]]; then
	fast=/dev/shm/redpilot-$(printf '%s' "$root" | cksum | cut -d' ' -f1)
fi
# The control plane's files (kwok's work dir: certificates, logs) and the
# local node's (pod logs, volumes) live there too: a process that writes to a
# disk other writers fill waits in the kernel's dirty-page throttling, and an
# API server or a Redis server waiting a second on a log line stalls the tests.
in_memory() { [[ $fast == /dev/shm/* ]]; }
# Makes $1 a link to $2 (a directory in memory), replacing a directory of
# the earlier layout (whose cluster `down` stopped first).
place() {
	in_memory || return 0
	if [[ -d $1 && ! -L $1 ]]; then
		echo "cluster: moving $1 into memory ($2); the old cluster goes"
		down >/dev/null 2>&1 || true
		rm -rf "$1"
	fi
	mkdir -p "$2"
	[[ -L $1 && $(readlink "$1") == "$2" ]] || ln -sfn "$2" "$1"
}

# Pod addresses of the kwok fake node (dev/kwok-node.yaml) and kwok's default.
fake_cidrs="10.250.0.0/16 10.0.0.0/24"

need() {
	local missing=0
	for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl; do
		if [[ ! -x $bin/$b ]]; then
			echo "cluster: bin/$b is missing: run 'make tools' first" >&2
			missing=1
		fi
	done
	return $missing
}

answers() {
	[[ -f $kubeconfig ]] && kubectl get --raw /readyz >/dev/null 2>&1
}

kwokctl() { "$bin/kwokctl" --name "$name" "$@"; }

exists() {
	[[ -d $KWOK_WORKDIR/clusters/$name ]]
}

up() {
	need
	mkdir -p "$state"
	place "$KWOK_WORKDIR" "$fast/kwok"
	place "$state/localnode" "$fast/localnode"
	if exists && answers; then
		echo "cluster: $name already up"
	else
		if exists && [[ ! -d $fast/etcd ]]; then
			echo "cluster: $name lost its etcd data (kept in memory); recreating"
			kwokctl delete cluster || true
		fi
		if exists; then
			echo "cluster: $name exists but does not answer; restarting it"
			kwokctl start cluster --timeout 120s || {
				echo "cluster: restart failed; recreating"
				kwokctl delete cluster || true
			}
		fi
		if ! answers; then
			echo "cluster: creating $name (kube $kube_version)"
			cp "$root/dev/audit-policy.yaml" "$state/audit-policy.yaml"
			rm -rf "$state/audit.log" "$fast"
			mkdir -p "$fast"
			place "$KWOK_WORKDIR" "$fast/kwok"
			place "$state/localnode" "$fast/localnode"
			ln -s "$fast/audit.log" "$state/audit.log"
			sed -e "s|@STATE@|$state|g" -e "s|@FAST@|$fast|g" "$root/dev/kwokctl.yaml" >"$state/kwokctl.yaml"
			kwokctl create cluster \
				--runtime binary \
				--config "$state/kwokctl.yaml" \
				--kube-apiserver-binary "$bin/kube-apiserver" \
				--kube-controller-manager-binary "$bin/kube-controller-manager" \
				--kube-scheduler-binary "$bin/kube-scheduler" \
				--kwok-controller-binary "$bin/kwok" \
				--etcd-binary "$bin/etcd" \
				--kube-authorization=true \
				--kube-admission=true \
				--wait 120s \
				--timeout 180s \
				--kubeconfig "$kubeconfig"
		fi
		kwokctl get kubeconfig >"$kubeconfig.tmp"
		mv "$kubeconfig.tmp" "$kubeconfig"
		chmod 600 "$kubeconfig"
	fi
	local i
	for i in $(seq 1 60); do
		answers && break
		sleep 1
	done
	answers || {
		echo "cluster: the apiserver did not become ready; logs in $KWOK_WORKDIR/clusters/$name/logs" >&2
		exit 1
	}
	# The control plane stands in for dedicated nodes: it gets a larger CPU
	# share than the test processes and the Redis servers beside it (as
	# root; elsewhere the default share).
	# On Linux a nice value belongs to a thread, not a process: every
	# thread is reniced (a Go runtime's threads, made before this, kept the
	# default share when only the main one was, and the API server went 11 s
	# without an answer under a full test lane); threads made later inherit
	# it from the thread that makes them.
	if [[ $(id -u) -eq 0 ]]; then
		local pid task
		for pid in $(pgrep -f "$KWOK_WORKDIR/clusters/$name/bin/(etcd|kube-apiserver)" || true); do
			for task in /proc/"$pid"/task/*; do
				renice -n -10 -p "${task##*/}" >/dev/null 2>&1 || true
			done
		done
	fi
	# Fake pods' addresses (the fake node's podCIDR, and kwok's default pool)
	# lead nowhere: connections to them fail at once, on this machine.
	for cidr in $fake_cidrs; do ip route replace blackhole "$cidr"; done
	kubectl apply --server-side --field-manager redpilot-dev -f "$root/dev/kwok-node.yaml" >/dev/null
	kubectl wait --for=condition=Ready node/kwok-node-0 --timeout=60s >/dev/null
	if [[ -f $root/dev/localnode.sh ]]; then
		bash "$root/dev/localnode.sh" start
	fi
	bash "$root/hack/stall-watch.sh" start
	echo "cluster: up; export KUBECONFIG=$kubeconfig"
	kubectl get nodes
}

down() {
	bash "$root/hack/stall-watch.sh" stop || true
	if [[ -f $root/dev/localnode.sh ]]; then
		bash "$root/dev/localnode.sh" stop || true
	fi
	if exists; then
		kwokctl delete cluster || true
	fi
	for cidr in $fake_cidrs; do ip route del blackhole "$cidr" 2>/dev/null || true; done
	rm -f "$kubeconfig"
	rm -rf "$fast" "$state/audit.log"
	# kwokctl stops the processes it started; make sure none outlived it.
	local left
	left=$(pgrep -f "$KWOK_WORKDIR/clusters/$name" || true)
	if [[ -n $left ]]; then
		kill $left 2>/dev/null || true
		sleep 2
		left=$(pgrep -f "$KWOK_WORKDIR/clusters/$name" || true)
		[[ -z $left ]] || kill -9 $left 2>/dev/null || true
	fi
	echo "cluster: down"
}

case ${1:-} in
up) up ;;
down) down ;;
status)
	if answers; then echo "cluster: $name answers at $kubeconfig"; else
		echo "cluster: $name does not answer"
		exit 1
	fi
	;;
*)
	echo "usage: dev/cluster.sh up|down|status" >&2
	exit 2
	;;
esac
