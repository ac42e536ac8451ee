#!/usr/bin/env python3
"""What can be checked of the MSRV (Cargo.toml's rust-version) with only a newer toolchain.

No older toolchain is installed and none can be fetched offline, so this cannot compile
the crate with that version. It checks instead that every crate the library depends on
(normal and build dependencies, all features, this platform) declares a rust-version no
newer than ours: a dependency that needs a newer compiler breaks users on our MSRV. Crates
that declare none are listed, not failed. Dev-dependencies (tests, examples, benches) are
reported but do not fail the check: they only concern contributors.

The other half runs in clippy: its `incompatible_msrv` lint (on by default) fails the
build on a standard-library API stabilised after Cargo.toml's rust-version. Neither catches
language features newer than the MSRV.
"""

import json
import subprocess
import sys


def version(text):
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    host = next(
        line.split(": ", 1)[1]
        for line in subprocess.run(
            ["rustc", "-vV"], check=True, capture_output=True, text=True
        ).stdout.splitlines()
        if line.startswith("host: ")
    )
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features",
             "--filter-platform", host, "--locked"],
            check=True, capture_output=True, text=True,
        ).stdout
    )
    packages = {p["id"]: p for p in meta["packages"]}
    root_id = meta["resolve"]["root"]
    root = packages[root_id]
    ours = root.get("rust_version")
    if not ours:
        sys.exit("Cargo.toml has no rust-version")
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

    def reachable(start_kinds):
        """Packages reachable from the root through edges whose kinds are in start_kinds
        at the root, and normal/build edges below it."""
        seen, stack = set(), []
        for dep in nodes[root_id]["deps"]:
            if dep["pkg"] == root_id:
                continue
            if any(k["kind"] in start_kinds for k in dep["dep_kinds"]):
                stack.append(dep["pkg"])
        while stack:
            pkg = stack.pop()
            if pkg in seen:
                continue
            seen.add(pkg)
            for dep in nodes[pkg]["deps"]:
                if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
                    stack.append(dep["pkg"])
        return seen

    library = reachable((None, "build"))
    dev_only = reachable((None, "build", "dev")) - library - {root_id}

    def too_new(ids):
        bad, undeclared = [], []
        for pkg in sorted(ids, key=lambda i: packages[i]["name"]):
            p = packages[pkg]
            rv = p.get("rust_version")
            if rv is None:
                undeclared.append(f"{p['name']} {p['version']}")
            elif version(rv) > version(ours):
                bad.append(f"{p['name']} {p['version']} needs Rust {rv}")
        return bad, undeclared

    bad, undeclared = too_new(library)
    dev_bad, _ = too_new(dev_only)
    print(f"MSRV {ours}: not compiled with Rust {ours} (no such toolchain here); checked "
          f"the rust-version of the library's {len(library)} dependencies instead "
          "(clippy's incompatible_msrv lint checks our own use of std)")
    if undeclared:
        print(f"  {len(undeclared)} declare no rust-version: {', '.join(undeclared)}")
    for line in dev_bad:
        print(f"  dev-dependency (contributors only): {line}")
    if bad:
        for line in bad:
            print(f"  too new for rust-version {ours}: {line}", file=sys.stderr)
        sys.exit(1)
    print("  all declared rust-versions are within the MSRV")


if __name__ == "__main__":
    main()
