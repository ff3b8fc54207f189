#!/usr/bin/env bash
# Builds one group of test and packaging tools from its pinned Go module and
# links the binaries into bin/.
#
#   tools/build.sh GROUP        (kube | etcd | kwok | operator-sdk | opm | olm | versitygw | prometheus | jaeger | prometheus-crds | cert-manager-crds | helm | image | grpcprobe)
#
# Binaries are built once per pinned version into a cache outside the clone
# ($REDPILOT_CACHE, default ~/.cache/redpilot/tools/<group>-<version>/), so a
# fresh clone on the same machine reuses them; bin/<name> is a symlink into it.
# Go's own module and build caches stay where `go env` puts them (also outside
# the clone).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cache=${REDPILOT_CACHE:-$HOME/.cache/redpilot}/tools
bin=$root/bin
export CGO_ENABLED=${CGO_ENABLED:-0}
export GOFLAGS=${GOFLAGS:--buildvcs=false}

group=${1:?usage: tools/build.sh GROUP}

# The module directory, the pinned version (read from go.mod so the two never
# disagree), the packages and the binary names of each group.
case $group in
kube)
	dir=kube
	mod=k8s.io/kubernetes
	pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
	;;
etcd)
	dir=etcd
	mod=go.etcd.io/etcd/server/v3
	pkgs=(go.etcd.io/etcd/server/v3)
	names=(etcd)
	;;
kwok)
	dir=kwok
	mod=sigs.k8s.io/kwok
	pkgs=(sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl)
	;;
operator-sdk)
	dir=operator-sdk
	mod=github.com/operator-framework/operator-sdk
	pkgs=(github.com/operator-framework/operator-sdk/cmd/operator-sdk
		github.com/operator-framework/operator-sdk/images/scorecard-test)
	tags=containers_image_openpgp
	;;
opm)
	dir=opm
	mod=github.com/operator-framework/operator-registry
	# catalog-semver (tools/opm/cmd/): OLM's semver catalog template run on
	# the catalog's rendered bundles (hack/catalog.sh).
	pkgs=(github.com/operator-framework/operator-registry/cmd/opm redpilot.dev/tools/opm/cmd/catalog-semver)
	tags=containers_image_openpgp
	;;
olm)
	dir=olm
	mod=github.com/operator-framework/operator-lifecycle-manager
	pkgs=(github.com/operator-framework/operator-lifecycle-manager/cmd/olm
		github.com/operator-framework/operator-lifecycle-manager/cmd/catalog
		github.com/operator-framework/operator-lifecycle-manager/cmd/package-server
		github.com/operator-framework/operator-lifecycle-manager/util/cpb)
	tags=containers_image_openpgp
	;;
versitygw)
	# The S3 server the backup suites store backups in (posix backend).
	dir=versitygw
	mod=github.com/versity/versitygw
	pkgs=(github.com/versity/versitygw/cmd/versitygw)
	;;
prometheus)
	# Prometheus and promtool: the insights suites scrape the dev cluster,
	# evaluate the alert rules and run the rule unit tests with them.
	dir=prometheus
	mod=github.com/prometheus/prometheus
	pkgs=(github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
	# Service discovery: file, HTTP (always in) and Kubernetes (the suites'
	# scrape configuration) only; the cloud providers' SDKs are most of a
	# cold build.
	tags=remove_all_sd,enable_kubernetes_sd
	;;
helm)
	# Helm: the chart suite lints and renders deploy/helm/redpilot and
	# installs, upgrades and uninstalls it on the dev cluster.
	dir=helm
	mod=helm.sh/helm/v3
	pkgs=(helm.sh/helm/v3/cmd/helm)
	;;
image)
	# The operator image without a container engine (tools/image/cmd/):
	# hack/image.sh and `make image` run it.
	dir=image
	mod=github.com/google/go-containerregistry
	# crane: the registry the test ground pushes to (crane registry serve)
	# and the client the local node pulls images with.
	pkgs=(redpilot.dev/tools/image/cmd/redpilot-image redpilot.dev/tools/image/cmd/redpilot-dirimage
		github.com/google/go-containerregistry/cmd/crane)
	;;
grpcprobe)
	# grpc_health_probe: the readiness check OLM runs in a catalog image's
	# pod; the catalog image (hack/publish.sh) carries it next to opm.
	dir=grpcprobe
	mod=github.com/grpc-ecosystem/grpc-health-probe
	pkgs=(github.com/grpc-ecosystem/grpc-health-probe)
	names=(grpc_health_probe)
	;;
jaeger)
	# Jaeger all-in-one (OTLP in, query API out, memory storage): the trace
	# suite sends the operator's spans to it and reads them back.
	dir=jaeger
	mod=github.com/jaegertracing/jaeger
	pkgs=(github.com/jaegertracing/jaeger/cmd/jaeger)
	;;
prometheus-crds)
	# Not a program: the monitoring.coreos.com CRDs of a pinned
	# prometheus-operator release, linked as bin/prometheus-operator-crds.
	dir=promcrds
	mod=github.com/prometheus-operator/prometheus-operator
	pkgs=()
	names=()
	;;
cert-manager-crds)
	# Not a program: the cert-manager.io CRDs of a pinned cert-manager
	# release, linked as bin/cert-manager-crds.
	dir=certmanagercrds
	mod=github.com/cert-manager/cert-manager
	pkgs=()
	names=()
	;;
*)
	echo "tools/build.sh: unknown group '$group'" >&2
	exit 2
	;;
esac

version=$(awk -v m="$mod" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$here/$dir/go.mod")
if [[ -z $version ]]; then
	echo "tools/build.sh: cannot read the pinned version of $mod from tools/$dir/go.mod" >&2
	exit 1
fi
if [[ -z ${names+x} ]]; then
	names=()
	for p in "${pkgs[@]}"; do names+=("${p##*/}"); done
fi

dest=$cache/$group-$version
case $group in
operator-sdk | opm | olm | image)
	# These wrappers may pin more than the main module (tools/operator-sdk
	# pins a newer validator library), so their builds are keyed by go.mod
	# and go.sum as well: a changed pin rebuilds. A module with programs of
	# its own (tools/<dir>/cmd/, and the packages they share in internal/)
	# is keyed by their sources too: an edit
	# rebuilds, and so is the list of packages built: a program added to a
	# group builds.
	own=()
	if [[ -d $here/$dir/cmd ]]; then
		mapfile -t own < <(cd "$here/$dir" && find cmd internal -type f -name '*.go' 2>/dev/null | LC_ALL=C sort)
	fi
	dest+=-$(
		cd "$here/$dir"
		{
			cat go.mod go.sum
			printf '%s\n' "${pkgs[@]}"
			if ((${#own[@]})); then
				printf '%s\n' "${own[@]}"
				cat "${own[@]}"
			fi
		} | sha256sum | cut -c1-8
	)
	;;
esac
link() {
	mkdir -p "$bin"
	for n in "${names[@]}"; do ln -sfn "$dest/$n" "$bin/$n"; done
	# OLM's CRDs come from the same module version as its binaries; the
	# packaging end-to-end test applies them from bin/olm-crds.
	if [[ $group == olm ]]; then
		if [[ ! -d $dest/crds ]]; then
			src=$(cd "$here/$dir" && go list -m -f '{{.Dir}}' "$mod")
			mkdir -p "$dest/crds.tmp.$$"
			cp "$src"/deploy/chart/crds/*.yaml "$dest/crds.tmp.$$/"
			chmod -R u+w "$dest/crds.tmp.$$"
			mv "$dest/crds.tmp.$$" "$dest/crds"
		fi
		ln -sfn "$dest/crds" "$bin/olm-crds"
	fi
	if [[ $group == prometheus-crds ]]; then
		ln -sfn "$dest/crds" "$bin/prometheus-operator-crds"
	fi
	if [[ $group == cert-manager-crds ]]; then
		ln -sfn "$dest/crds" "$bin/cert-manager-crds"
	fi
}

if [[ -f $dest/.complete ]]; then
	link
	echo "tools: $group $version cached in $dest"
	exit 0
fi

ldflags="-s -w"
if [[ $group == kube ]]; then
	# Without these the apiserver reports v0.0.0, which breaks version checks
	# such as OLM's minKubeVersion.
	minor=$(echo "$version" | cut -d. -f2)
	vpkg=k8s.io/component-base/version
	ldflags+=" -X $vpkg.gitVersion=$version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
	ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
fi
if [[ $group == olm ]]; then
	ldflags+=" -X github.com/operator-framework/operator-lifecycle-manager/pkg/version.OLMVersion=${version#v}"
fi
if [[ $group == operator-sdk ]]; then
	vpkg=github.com/operator-framework/operator-sdk/internal/version
	# The Kubernetes version operator-sdk is built against: its client-go.
	kver=$(awk '$1 == "k8s.io/client-go" {sub(/^v0\./, "v1.", $2); print $2; exit}' "$here/$dir/go.mod")
	ldflags+=" -X $vpkg.Version=$version -X $vpkg.GitVersion=$version -X $vpkg.KubernetesVersion=${kver:-unknown}"
fi
if [[ $group == opm ]]; then
	ldflags+=" -X github.com/operator-framework/operator-registry/cmd/opm/version.opmVersion=$version"
fi

# About how long a cold build takes on 2 cores, for the progress line.
case $group in
kube) expect="5-10 min" ;;
prometheus | jaeger | olm | operator-sdk) expect="about 5 min" ;;
*) expect="1-3 min" ;;
esac
# Go's own output (hundreds of `go: downloading` lines on a cold cache) goes
# to a log beside the cache; a failure prints its end.
mkdir -p "$cache"
log=$cache/$group-$version.build.log
echo "tools: building $group $version into $dest ($expect on 2 cores the first time; cached afterwards; go's output in $log)"
start=$(date +%s)
: >"$log"
failed() {
	echo "tools: building $group $version failed; the last 40 lines of $log:" >&2
	tail -n 40 "$log" >&2
	exit 1
}
tmp=$dest.tmp.$$
rm -rf "$tmp"
mkdir -p "$tmp"
# A progress line every 30 s instead of minutes of silence (go build prints
# nothing while it downloads and compiles).
(
	while sleep 30 </dev/null >/dev/null 2>&1; do
		echo "tools: still building $group $version: $(($(date +%s) - start))s elapsed"
	done
) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true; rm -rf "$tmp"' EXIT
if [[ $group == prometheus-crds || $group == cert-manager-crds ]]; then
	src=$(cd "$here/$dir" && go mod download -json "$mod@$version" 2>>"$log" | awk -F'"' '$2 == "Dir" {print $4}')
	[[ -n $src ]] || failed
	mkdir -p "$tmp/crds"
	case $group in
	prometheus-crds) cp "$src"/example/prometheus-operator-crd/*.yaml "$tmp/crds/" ;;
	cert-manager-crds) cp "$src"/deploy/crds/cert-manager.io_*.yaml "$tmp/crds/" ;;
	esac
	chmod -R u+w "$tmp/crds"
fi
# A group whose binaries take their packages' names builds in one `go build`
# into the directory: the graph is loaded once and the binaries link side by
# side (kube's four links were minutes one after another).
same_names=1
for i in "${!pkgs[@]}"; do
	[[ ${names[$i]} == "${pkgs[$i]##*/}" ]] || same_names=0
done
flags=(-trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags")
(
	cd "$here/$dir"
	if ((${#pkgs[@]} && same_names)); then
		go build "${flags[@]}" -o "$tmp/" "${pkgs[@]}"
	else
		for i in "${!pkgs[@]}"; do
			go build "${flags[@]}" -o "$tmp/${names[$i]}" "${pkgs[$i]}"
		done
	fi
) >>"$log" 2>&1 || failed
touch "$tmp/.complete"
rm -rf "$dest"
mv "$tmp" "$dest"
kill "$ticker" 2>/dev/null || true
trap - EXIT
link
echo "tools: built $group $version in $(($(date +%s) - start))s"
