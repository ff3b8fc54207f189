#!/usr/bin/env bash
# Keeps Cargo's target directory (shared by every clone on this machine, see
# .ci/run) from growing without bound: Cargo never deletes an artifact, and
# each change to this crate leaves its test binaries (about 120 MB each, some
# 45 of them) and incremental state behind. A run on a machine whose disk had
# filled that way failed with "No space left on device" in the middle of the
# suites. This removes, for this workspace's own crates only (dependencies are
# built once and kept):
#   - every build of a crate but the three newest (a crate's library, its unit
#     test binary and a second clone's build of it each have their own hash);
#   - the incremental state when CARGO_INCREMENTAL=0 (CI builds without it);
#   - the chaos harness's timelines older than a week.
# Then it says how much room the disk has, and fails when it has less than
# REDPILOT_MIN_FREE_GB (default 6: a test run writes about 3 GB of servers'
# data, snapshots and logs besides the build) so a full disk is named before
# the suites start rather than in a failed write halfway through them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
min_free_gb=${REDPILOT_MIN_FREE_GB:-6}
shopt -s nullglob

freed_kib=0
remove() {
	local kib
	kib=$( (du -sk "$@" 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
	rm -rf "$@"
	freed_kib=$((freed_kib + kib))
}

for profile in debug release; do
	deps=$target/$profile/deps
	[[ -d $deps ]] || continue
	names="redpilot libredpilot redpilot_exporter kubectl_redpilot redpilot_localnode localnode"
	for t in "$root"/tests/*.rs; do
		names+=" $(basename "$t" .rs)"
	done
	for name in $names; do
		# Newest first; one line per build hash.
		mapfile -t stale < <(
			cd "$deps" && ls -t 2>/dev/null | grep -E "^${name}-[0-9a-f]{16}([.-]|$)" |
				sed -E "s/^(${name}-[0-9a-f]{16}).*/\1/" | awk '!seen[$0]++' | tail -n +4
		)
		for h in "${stale[@]}"; do
			remove "$deps/$h" "$deps/$h".* "$deps/$h"-*
		done
	done
	if [[ ${CARGO_INCREMENTAL:-} == 0 && -d $target/$profile/incremental ]]; then
		remove "$target/$profile/incremental"
	fi
done
if [[ -d $target/tmp/chaos ]]; then
	mapfile -t old < <(find "$target/tmp/chaos" -mindepth 1 -maxdepth 1 -mtime +7)
	((${#old[@]} == 0)) || remove "${old[@]}"
fi

mkdir -p "$target"
free_kib=$(df -Pk "$target" | awk 'NR == 2 {print $4}')
echo "target $target: freed $((freed_kib / 1024)) MiB of stale builds; $((free_kib / 1048576)) GiB free on its disk"
if ((free_kib < min_free_gb * 1048576)); then
	echo "error: $((free_kib / 1024)) MiB free on the disk of $target; a test run needs ${min_free_gb} GiB" >&2
	echo "       (servers' data, snapshots, logs). Free some room (or set REDPILOT_MIN_FREE_GB) and run again." >&2
	df -h "$target" >&2
	exit 1
fi
