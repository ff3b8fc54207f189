#!/usr/bin/env python3
"""The release link's function order, from what an idle operator runs.

Usage: hot-symbols.py CALLGRIND_DUMP BINARY > hack/hot-symbols.txt

CALLGRIND_DUMP is callgrind's dump of an idle window (`make hot-symbols`
runs `make bench-idle` with IDLE_CALLGRIND for it); BINARY the release build
it ran. Out: the mangled names of the binary's functions that ran in the
window, the busiest first, one per line, for the linker's
`--symbol-ordering-file` (build.rs passes it to the release link). Placed
together at the start of the code, they fill a few hundred pages instead of
touching one function in each of thousands: an idle operator keeps only
those resident (see src/pages.rs).
"""
import subprocess
import sys


def functions_run(dump):
    """Self cost (the first event, instructions) of each function named in
    a callgrind dump, by name."""
    names = {}  # compressed id -> name
    cost = {}
    current = None
    skip_next = False
    with open(dump, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith(("fn=", "cfn=")):
                key, _, rest = line.partition("=")
                ident, _, name = rest.partition(" ")
                if name:
                    names[ident] = name
                name = names.get(ident, ident)
                cost.setdefault(name, 0)
                if key == "fn":
                    current = name
                continue
            if line.startswith("calls="):
                # The line after is the call's inclusive cost: not self cost.
                skip_next = True
                continue
            if skip_next:
                skip_next = False
                continue
            if current and (line[:1].isdigit() or line[:1] in "+-*"):
                parts = line.split()
                if len(parts) >= 2 and current:
                    try:
                        cost[current] += int(parts[1])
                    except ValueError:
                        pass
    return cost


def defined_functions(binary):
    out = subprocess.run(
        ["nm", "--defined-only", binary], capture_output=True, text=True, check=True
    ).stdout
    return {
        parts[2]
        for parts in (line.split() for line in out.splitlines())
        if len(parts) == 3 and parts[1] in "tTwW"
    }


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dump, binary = sys.argv[1], sys.argv[2]
    cost = functions_run(dump)
    ours = defined_functions(binary)
    run = sorted((n for n in cost if n in ours), key=lambda n: (-cost[n], n))
    if not run:
        sys.exit(f"no function of {binary} in {dump}: was it the same build?")
    print("# Functions an idle operator runs, the busiest first: the release")
    print("# link's --symbol-ordering-file (build.rs). Made by `make hot-symbols`")
    print(f"# from a callgrind dump of `make bench-idle`; {len(run)} functions.")
    for n in run:
        print(n)
    print(f"{len(run)} of the {len(cost)} functions run are the binary's", file=sys.stderr)


if __name__ == "__main__":
    main()
