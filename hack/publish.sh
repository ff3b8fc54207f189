#!/usr/bin/env bash
# Publishes Redpilot to an OCI registry as a release pipeline does: the
# operator image of every release, bundle images whose CSV names that image
# by digest, and a catalog image rendered from the pushed bundle images by
# stock `opm alpha render-template semver`, served by `opm serve` from the
# image's own files. Two helper images OLM runs to unpack a bundle image are
# pushed too (OLM's catalog operator takes them as --util-image and
# --opmImage).
#
#   hack/publish.sh            (make bundle-image catalog-image)
#
# Environment:
#   REGISTRY      host:port of the registry (default 127.0.0.1:5100). A
#                 loopback registry is spoken to over plain HTTP.
#   OPERATOR_BIN  this release's operator binary (default: the release build,
#                 which `make bundle-image` makes first); redpilot-exporter
#                 is taken from beside it (hack/image.sh)
#   OUT           where to write (default dist/publish):
#                   OUT/images.env         every reference pushed, with digest
#                   OUT/catalog/           the rendered catalog (the image's /configs)
#                   OUT/bundles/<version>/ each bundle as pushed
#
# Earlier releases (catalog/releases.txt) are published from their commit:
# their bundle/ from git, their operator from bin/releases/redpilot-<version>
# (`make release-bins`). Every time inside the images is SOURCE_DATE_EPOCH,
# else this commit's time, so a second run pushes the same digests.
#
# `make registry` starts a registry (bin/crane registry serve) on $REGISTRY
# with its blobs in .dev/registry/; this script only needs one to answer.
set -euo pipefail
trap 'echo "publish: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
registry=${REGISTRY:-127.0.0.1:5100}
out=${OUT:-$root/dist/publish}
operator_bin=${OPERATOR_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/redpilot}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
pkg=redpilot

fail() {
	echo "publish: $*" >&2
	exit 1
}
for t in crane redpilot-dirimage redpilot-image opm catalog-semver grpc_health_probe cpb; do
	[[ -x bin/$t ]] || fail "bin/$t is missing: run 'make tools' (make bundle-image does)"
done
[[ -x /bin/busybox || -x /usr/bin/busybox ]] ||
	fail "busybox is missing (the unpack utility image's cp): apt-get install busybox-static (hack/setup.sh does)"
busybox=$(command -v busybox || echo /bin/busybox)
curl -fsS -o /dev/null "http://$registry/v2/" ||
	fail "no registry answers at http://$registry/v2/: run 'make registry' or set REGISTRY"

rm -rf "$out"
mkdir -p "$out/bundles" "$out/catalog/$pkg"
env_file=$out/images.env
: >"$env_file"
record() { # NAME REF@DIGEST
	echo "$1=$2" >>"$env_file"
	echo "publish: $1 $2"
}
# The digest a push printed (the last "ref@sha256:..." it wrote).
digest_of() { grep -o 'sha256:[0-9a-f]\{64\}' | tail -1; }

version=$(awk '/^  version:/ {print $2; exit}' bundle/manifests/$pkg.clusterserviceversion.yaml | tr -d '"')
mapfile -t lines < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' catalog/releases.txt)

# 1. The operator image and the bundle image of every release.
for l in "${lines[@]}"; do
	read -r v _ commit <<<"$l"
	dir=$out/bundles/$v
	if [[ $v == "$version" ]]; then
		bin=$operator_bin
		cp -r bundle "$dir"
	else
		[[ -n $commit ]] || fail "release $v has no commit in catalog/releases.txt"
		bin=bin/releases/redpilot-$v
		mkdir -p "$dir"
		git archive "$commit" bundle | tar -x -C "$dir" --strip-components=1
	fi
	[[ -f $bin ]] || fail "no operator binary for release $v at $bin (make release-bins builds earlier releases; make bundle-image this one)"
	img=$out/operator-$v
	# Releases from before the metrics sidecar had a binary of its own ship
	# the operator alone.
	no_exporter=0
	if [[ $v != "$version" ]]; then
		git cat-file -e "$commit:src/bin/redpilot-exporter.rs" 2>/dev/null &&
			fail "release $v ships redpilot-exporter, which make release-bins does not build yet"
		no_exporter=1
	fi
	SOURCE_DATE_EPOCH=$epoch VERSION=$v IMAGE_REPO=$registry/redpilot/redpilot NO_EXPORTER=$no_exporter \
		bash hack/image.sh "$bin" "$img" >/dev/null
	pushed=$(bin/crane push "$img/oci" "$registry/redpilot/redpilot:$v" 2>&1) ||
		fail "pushing the operator image of $v: $pushed"
	d=$(digest_of <<<"$pushed")
	operator=$registry/redpilot/redpilot@$d
	record "OPERATOR_$(tr . _ <<<"$v")" "$operator"

	# The CSV names the operator image it was released with by digest:
	# containerImage, the Deployment and the agent image it passes on.
	csv=$dir/manifests/$pkg.clusterserviceversion.yaml
	grep -q "quay.io/redpilot/redpilot:$v" "$csv" || fail "$csv does not name quay.io/redpilot/redpilot:$v"
	sed -i "s#quay.io/redpilot/redpilot:$v#$operator#g" "$csv"
	labels=()
	while IFS= read -r kv; do labels+=(--label "$kv"); done < <(
		awk '/^annotations:/ {on = 1; next} on && /^  [a-z]/ {sub(/^  /, ""); k = $1; sub(/:$/, "", k); $1 = ""; sub(/^ /, ""); print k "=" $0}' \
			"$dir/metadata/annotations.yaml"
	)
	# What bundle.Dockerfile copies: manifests, metadata and the scorecard
	# tests.
	adds=(--add "$dir/manifests:/manifests" --add "$dir/metadata:/metadata")
	[[ -d $dir/tests ]] && adds+=(--add "$dir/tests:/tests")
	d=$(bin/redpilot-dirimage --push "$registry/redpilot/redpilot-bundle:$v" --created "$epoch" \
		"${adds[@]}" "${labels[@]}" | digest_of)
	[[ -n $d ]] || fail "pushing the bundle image of $v"
	record "BUNDLE_$(tr . _ <<<"$v")" "$registry/redpilot/redpilot-bundle@$d"
done

# 2. The helper images OLM runs to unpack a bundle image: its util image
#    (cp and cpb) and its opm image (`opm alpha bundle extract`).
d=$(bin/redpilot-dirimage --push "$registry/redpilot/olm-util:latest" --created "$epoch" \
	--add "$busybox:/bin/busybox" --link /bin/cp:busybox --link /bin/sh:busybox \
	--add "$(readlink -f bin/cpb):/bin/cpb" --env PATH=/bin | digest_of)
record OLM_UTIL "$registry/redpilot/olm-util@$d"
d=$(bin/redpilot-dirimage --push "$registry/redpilot/opm:latest" --created "$epoch" \
	--add "$(readlink -f bin/opm):/bin/opm" --add "$(readlink -f bin/grpc_health_probe):/bin/grpc_health_probe" \
	--env PATH=/bin --entrypoint '["/bin/opm"]' | digest_of)
record OPM "$registry/redpilot/opm@$d"

# 3. The catalog, rendered from the pushed bundle images with the checked-in
#    semver template, each bundle named by the digest just pushed.
template=$out/$pkg.semver.yaml
cp catalog/$pkg.semver.yaml "$template"
for l in "${lines[@]}"; do
	read -r v _ <<<"$l"
	ref=$(awk -F= -v k="BUNDLE_$(tr . _ <<<"$v")" '$1 == k {print $2}' "$env_file")
	sed -i "s#quay.io/redpilot/redpilot-bundle:$v\$#$ref#" "$template"
done
grep -q quay.io "$template" && fail "$template still names a bundle outside $registry"
rendered=$out/rendered.json
# opm pulls with containers/image, which wants a signature policy: accept
# what this registry serves (the digests are checked on pull), in a HOME of
# its own so that nothing of the user's configuration is read or written.
opm_home=$out/opm-home
mkdir -p "$opm_home/.config/containers"
echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$opm_home/.config/containers/policy.json"
HOME=$opm_home bin/opm alpha render-template semver --use-http -o json "$template" >"$rendered" 2>"$out/render.log" ||
	fail "opm alpha render-template semver failed: $(tail -5 "$out/render.log")"
# The template makes major-version channels (stable-v0); subscriptions made
# before they existed name the plain archetype (stable). bin/catalog-semver
# adds them as `make catalog` does (and refuses a second major line).
bin/catalog-semver -archetypes "$rendered" -out "$out/catalog/$pkg/catalog.json" ||
	fail "adding the archetype channels to the rendered catalog"

# 4. The catalog image (hack/catalog-image.sh, which validates the catalog
#    first): opm serving /configs, as OLM's grpc CatalogSource runs it, with
#    its serving cache prebuilt.
catalog=$(bash hack/catalog-image.sh "$out/catalog" "$registry/redpilot/redpilot-catalog:latest") ||
	fail "building the catalog image"
record CATALOG "$catalog"
echo "publish: catalog image and ${#lines[@]} release(s) pushed to $registry; references in $env_file"
