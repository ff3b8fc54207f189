#!/usr/bin/env bash
# `make run`: uses the cluster named by KUBECONFIG when it answers; otherwise
# brings up the local dev cluster (dev/cluster.sh up) and uses that.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin

if [[ -n ${KUBECONFIG:-} ]] && "$bin/kubectl" get --raw /readyz >/dev/null 2>&1; then
	echo "run: using the cluster configured by KUBECONFIG=$KUBECONFIG"
else
	bash "$root/dev/cluster.sh" up
	export KUBECONFIG=$root/.dev/kubeconfig
fi

"$bin/kubectl" version
"$bin/kubectl" get nodes -o wide
cat <<MSG

The cluster is ready. Connect with:
  export KUBECONFIG=$KUBECONFIG
  $bin/kubectl get nodes
Stop it with: make cluster-down
MSG
