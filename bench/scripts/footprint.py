#!/usr/bin/env python3
"""The code a request runs through: its distinct instructions and the 64-byte cache lines
they lie on, from a callgrind profile of `layer_profile` taken with one instruction a line.

Usage: footprint.py ROUNDS PROFILE [BASELINE [N]]. PROFILE comes from
`valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no
--toggle-collect='layer_profile::run' <layer_profile> <case> ROUNDS`. An instruction counts
when it ran on nine requests in ten or more: the code every request needs. With BASELINE (a
profile of another case, e.g. `bare`) it also lists the N functions whose distinct
instructions grew most over it.

Executed instructions do not tell this: a loop run twice costs twice, while a server pays for
each distinct line once per request, fetched again after the kernel's work between two
requests (a request path wider than the level-1 instruction cache misses on every line even
in a tight loop).
"""
import collections
import re
import sys

COST = re.compile(r"^(0x[0-9a-f]+)\s+\d+\s+(\d+)")


def per_function(path):
    """Executions of each instruction address, per function, from a callgrind profile."""
    counts = collections.defaultdict(collections.Counter)
    function, after_call = None, False
    with open(path, encoding="utf-8") as profile:
        for line in profile:
            if line.startswith("fn="):
                function = line[3:].split(" [")[0].strip()
            elif line.startswith("calls="):
                # The next cost line is the call's inclusive cost, not an instruction's.
                after_call = True
            elif (m := COST.match(line)) and function:
                if not after_call:
                    counts[function][int(m.group(1), 16)] += int(m.group(2))
                after_call = False
    return counts


def every_request(counts, rounds):
    """The addresses each function runs on nine requests in ten or more."""
    return {f: {a for a, n in c.items() if n >= 0.9 * rounds} for f, c in counts.items()}


def main():
    rounds = int(sys.argv[1])
    hot = every_request(per_function(sys.argv[2]), rounds)
    addresses = set().union(*hot.values())
    lines = {a // 64 for a in addresses}
    print(f"{len(addresses)} distinct instructions on {len(lines)} cache lines per request")
    if len(sys.argv) < 4:
        return
    base = every_request(per_function(sys.argv[3]), rounds)
    grown = [(len(a) - len(base.get(f, ())), f) for f, a in hot.items()]
    total = len(addresses) - len(set().union(*base.values()))
    print(f"{total:+d} distinct instructions over the baseline")
    for n, function in sorted(grown, reverse=True)[: int(sys.argv[4]) if len(sys.argv) > 4 else 20]:
        print(f"{n:+6d}  {function[:110]}")


if __name__ == "__main__":
    main()
