#!/usr/bin/env bash
# Builds the operator binary of an earlier release from its git commit, for
# the OLM upgrade test (an operator installed at that release is upgraded to
# this tree). catalog/releases.txt names each release's commit; the tag
# v<version> is checked against it when present.
#
#   hack/release-bin.sh 0.1.0     -> bin/releases/redpilot-0.1.0
#                                    bin/releases/catalog-0.1.0 (its catalog/)
#
# The source is exported (git archive) and built once per commit into
# $REDPILOT_CACHE (default ~/.cache/redpilot)/releases, outside the clone,
# with its own Cargo target directory; bin/releases/ links to the result.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${1:?usage: hack/release-bin.sh <version>}
fail() {
	echo "release-bin: $*" >&2
	exit 1
}
commit=$(awk -v v="$version" '$1 == v && $3 != "" {print $3}' <(sed 's/#.*//' catalog/releases.txt))
[[ -n $commit ]] || fail "catalog/releases.txt names no commit for release $version"
git cat-file -e "$commit^{commit}" 2>/dev/null ||
	fail "commit $commit of release $version is not in this clone (fetch the full history)"
if tag=$(git rev-parse -q --verify "refs/tags/v$version^{commit}" 2>/dev/null); then
	[[ $tag == "$commit"* ]] || fail "tag v$version is $tag, catalog/releases.txt says $commit"
fi
cache=${REDPILOT_CACHE:-$HOME/.cache/redpilot}/releases
out=$cache/redpilot-$version-$commit
if [[ ! -x $out ]]; then
	src=$cache/src-$commit
	rm -rf "$src"
	mkdir -p "$src"
	git archive "$commit" | tar -x -C "$src"
	echo "release-bin: building redpilot $version ($commit)" >&2
	(cd "$src" && CARGO_TARGET_DIR=$cache/target cargo build --locked --bin redpilot)
	cp "$cache/target/debug/redpilot" "$out.tmp"
	mv "$out.tmp" "$out"
	rm -rf "$src"
fi
catalog=$cache/catalog-$commit
if [[ ! -d $catalog ]]; then
	rm -rf "$catalog.tmp"
	mkdir -p "$catalog.tmp"
	git archive "$commit" catalog | tar -x -C "$catalog.tmp" --strip-components=1
	mv "$catalog.tmp" "$catalog"
fi
mkdir -p bin/releases
ln -sfn "$out" "bin/releases/redpilot-$version"
ln -sfn "$catalog" "bin/releases/catalog-$version"
echo "bin/releases/redpilot-$version -> $out; bin/releases/catalog-$version -> $catalog"
