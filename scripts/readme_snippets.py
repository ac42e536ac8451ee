#!/usr/bin/env python3
"""The READMEs' Rust snippets, built as a new project builds them.

Doc tests build the snippets inside the crate, where its dev-dependencies are at hand and
unused imports are allowed; a reader pastes them into a project of their own with the
README's `[dependencies]` block and nothing else. For each README this makes that project
(under target/readme-snippets/, the block as written, the crates of this workspace patched
in by path, the workspace's Cargo.lock so the versions are the ones already fetched),
one binary per `rust` snippet, and checks it with every warning an error.
"""

import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
READMES = {"tollgate": ROOT / "README.md", "tollgate-admin": ROOT / "admin" / "README.md"}
PATCH = {"tollgate": ROOT, "tollgate-admin": ROOT / "admin"}
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.S | re.M)


def snippets(text):
    """The README's `[dependencies]` block and its Rust snippets (rustdoc's hidden `# `
    lines shown, as the reader of the rendered page would not see but the test builds)."""
    dependencies, code = None, []
    for info, body in FENCE.findall(text):
        kind = info.split(",")[0].strip()
        if kind == "toml" and body.startswith("[dependencies]"):
            dependencies = body
        elif kind == "rust":
            lines = [l[2:] if l.startswith("# ") else l for l in body.splitlines()]
            code.append("\n".join(lines) + "\n")
    return dependencies, code


def project(name, readme):
    dependencies, code = snippets(readme.read_text())
    if dependencies is None or not code:
        sys.exit(f"{readme}: no [dependencies] block or no rust snippet")
    crate = ROOT / "target" / "readme-snippets" / name
    shutil.rmtree(crate / "src", ignore_errors=True)
    (crate / "src" / "bin").mkdir(parents=True)
    patch = "".join(f'{dep} = {{ path = "{path}" }}\n' for dep, path in PATCH.items())
    (crate / "Cargo.toml").write_text(
        f'[package]\nname = "readme-{name}"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
        f"{dependencies}\n[patch.crates-io]\n{patch}\n[workspace]\n"
    )
    shutil.copy(ROOT / "Cargo.lock", crate / "Cargo.lock")
    for i, snippet in enumerate(code):
        (crate / "src" / "bin" / f"snippet{i}.rs").write_text("#![deny(warnings)]\n" + snippet)
    return crate


def main():
    for name, readme in READMES.items():
        crate = project(name, readme)
        print(f"{readme.relative_to(ROOT)}: checking its snippets in {crate.relative_to(ROOT)}")
        # One target directory for both projects: the second reuses the first's builds.
        target = ROOT / "target" / "readme-snippets" / "target"
        subprocess.run(
            ["cargo", "check", "--quiet", "--bins", "--target-dir", str(target)],
            cwd=crate,
            check=True,
        )


if __name__ == "__main__":
    main()
