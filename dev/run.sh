#!/usr/bin/env bash
# `make run`: a working Redpilot in one command.
#
# 1. Uses the cluster named by KUBECONFIG when it answers; otherwise brings up
#    the local dev cluster (dev/cluster.sh up) and uses that.
# 2. Installs the CRDs and RBAC, builds the operator and starts it in the
#    background (log: .dev/operator.log; stop: make run-stop).
# 3. Applies the Replication sample, waits until it is Ready and prints how to
#    connect, and how to look at it with the kubectl plugin (a debug build,
#    bin/kubectl-redpilot, unless `make plugin` put a release build there).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin
state=$root/.dev
sample=${SAMPLE:-$root/config/samples/redpilot_v1alpha1_redis_replication.yaml}
ns=${NAMESPACE:-default}
mkdir -p "$state"

# The operator and plugin build runs while the tools build and the cluster
# comes up: on a first run both compilers leave a core idle at times (a
# link, the crate's own compile), so together they finish sooner.
# Both programs of the operator's image: the pods' metrics sidecar runs
# redpilot-exporter (dev/images.yaml maps the image to both). The plugin is
# one more link of the same crate.
echo "run: building the operator and the kubectl plugin (log $state/build.log)"
(cd "$root" && cargo build --bin redpilot --bin redpilot-exporter --bin kubectl-redpilot) \
	>"$state/build.log" 2>&1 &
build=$!
# The tool groups build side by side too: a group's module downloads and
# links leave cores the others' compiles take.
if ! make -C "$root" --no-print-directory -j3 tools-cluster engines; then
	kill "$build" 2>/dev/null || true
	exit 1
fi

if [[ -n ${KUBECONFIG:-} ]] && "$bin/kubectl" get --raw /readyz >/dev/null 2>&1; then
	echo "run: using the cluster configured by KUBECONFIG=$KUBECONFIG"
else
	bash "$root/dev/cluster.sh" up
	export KUBECONFIG=$state/kubeconfig
fi
kubectl() { "$bin/kubectl" "$@"; }

echo "run: installing CRDs"
kubectl apply --server-side --force-conflicts --field-manager redpilot-dev -f "$root/crds/" >/dev/null
kubectl wait --for=condition=Established crd/redis.redpilot.io --timeout=60s >/dev/null
if [[ -d $root/config/rbac ]]; then
	kubectl create namespace redpilot-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
	kubectl apply --server-side --force-conflicts --field-manager redpilot-dev -k "$root/config/rbac" >/dev/null
fi

if ! wait "$build"; then
	echo "run: building the operator failed; the end of $state/build.log:" >&2
	tail -n 40 "$state/build.log" >&2
	exit 1
fi
echo "run: operator built"
target=${CARGO_TARGET_DIR:-$root/target}
operator=$target/debug/redpilot
# A release build from `make plugin` is kept; otherwise the debug one.
if [[ ! -e $bin/kubectl-redpilot || $(readlink "$bin/kubectl-redpilot") == */debug/kubectl-redpilot ]]; then
	ln -sf "$target/debug/kubectl-redpilot" "$bin/kubectl-redpilot"
fi

if [[ -f $state/operator.pid ]] && kill -0 "$(cat "$state/operator.pid")" 2>/dev/null; then
	echo "run: stopping the previous operator (pid $(cat "$state/operator.pid"))"
	kill "$(cat "$state/operator.pid")" || true
	sleep 1
fi
kubectl create namespace redpilot-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# Port 0 picks a free port; the operator logs the address it bound.
POD_NAMESPACE=redpilot-system nohup "$operator" run --log-format json \
	--metrics-addr "127.0.0.1:${METRICS_PORT:-0}" >"$state/operator.log" 2>&1 &
pid=$!
echo $pid >"$state/operator.pid"
addr=
for _ in $(seq 1 50); do
	if ! kill -0 $pid 2>/dev/null; then
		echo "run: the operator exited; its log:" >&2
		cat "$state/operator.log" >&2
		exit 1
	fi
	addr=$(grep -o '"addr":"[^"]*"' "$state/operator.log" | head -n 1 | cut -d'"' -f4 || true)
	[[ -n $addr ]] && break
	sleep 0.2
done
echo "run: operator started (pid $pid, log $state/operator.log, metrics http://$addr/metrics)"

name=$(awk '/^  name:/ {print $2; exit}' "$sample")
echo "run: applying $(basename "$sample") as redis/$name in namespace $ns"
kubectl apply -n "$ns" -f "$sample" >/dev/null
if ! kubectl wait -n "$ns" "redis/$name" --for=condition=Ready --timeout=180s >/dev/null; then
	echo "run: redis/$name did not become Ready within 180s" >&2
	kubectl describe -n "$ns" "redis/$name" >&2 || true
	tail -n 30 "$state/operator.log" >&2 || true
	exit 1
fi
kubectl get -n "$ns" redis "$name"

primary=$(kubectl get -n "$ns" redis "$name" -o jsonpath='{.status.primary}')
ip=$(kubectl get -n "$ns" pod "$primary" -o jsonpath='{.status.podIP}')
secret=$(kubectl get -n "$ns" redis "$name" -o jsonpath='{.status.authSecret}')
# With spec.tls: the CA of the certificate's Secret (and, when the servers
# ask clients for one, a certificate; the servers' own here).
tls_flags=
tls_files=
if [[ -n $(kubectl get -n "$ns" redis "$name" -o jsonpath='{.spec.tls}') ]]; then
	tls_secret=$(kubectl get -n "$ns" redis "$name" -o jsonpath='{.spec.tls.secretName}')
	if [[ -z $tls_secret ]]; then
		if [[ -n $(kubectl get -n "$ns" redis "$name" -o jsonpath='{.spec.tls.issuerRef}') ]]; then
			tls_secret=$name-server-tls
		else
			tls_secret=$name-tls
		fi
	fi
	tls_files="  $bin/kubectl get secret -n $ns $tls_secret -o jsonpath='{.data.ca\.crt}' | base64 -d > ca.crt"
	tls_flags=" --tls --cacert ca.crt"
	auth=$(kubectl get -n "$ns" redis "$name" -o jsonpath='{.spec.tls.clientAuth}')
	if [[ $auth == Required || $auth == Optional ]]; then
		tls_files+=$'\n'"  $bin/kubectl get secret -n $ns $tls_secret -o jsonpath='{.data.tls\.crt}' | base64 -d > client.crt"
		tls_files+=$'\n'"  $bin/kubectl get secret -n $ns $tls_secret -o jsonpath='{.data.tls\.key}' | base64 -d > client.key   # or a client certificate of your own from the same CA"
		tls_flags+=" --cert client.crt --key client.key"
	fi
	tls_files+=$'\n'
fi
cat <<MSG

Redis $ns/$name is Ready. Its primary is $primary at $ip:6379.
Connect:
  export KUBECONFIG=$KUBECONFIG
  export REDISCLI_AUTH=\$($bin/kubectl get secret -n $ns $secret -o jsonpath='{.data.password}' | base64 -d)
${tls_files}  redis-cli$tls_flags -h $ip -p 6379 ping
Inside the cluster the Services are $name (read-write, the primary) and $name-ro (replicas).
Watch it:   $bin/kubectl get redis -n $ns -w
Status:     export PATH=$bin:\$PATH; kubectl redpilot status $name -n $ns
            (also: advise, switchover, backup, hibernate, wake; kubectl redpilot --help)
Stop:       make run-stop   (the operator)   |   make cluster-down   (everything)
MSG
