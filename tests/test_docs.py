"""The documented commands run as written, in order, from a fresh copy of the project.

Every fenced ``bash`` block of README.md and docs/*.md carries a marker on the line
before it: ``<!-- docs-test: quick -->`` (run here) or ``<!-- docs-test: skip: REASON -->``
(Ray runs, docker, other hosts, installs: each says why). The quick blocks run in
document order (README.md, then docs/ by name) in a copy of the tracked and
unignored files, committed to a new git repository, with this interpreter's
``bin/`` on PATH; each must exit 0, and ``git status --porcelain`` must be clean
afterwards: what the docs write (shards, credentials, results) is ignored by git.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*docs-test:\s*(quick|skip)\s*(?::\s*(.*?))?\s*-->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass
class Block:
    path: Path
    line: int  #: 1-based line of the opening fence
    lang: str
    kind: str | None  #: "quick", "skip" or None (unmarked)
    reason: str
    code: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with the docs-test marker right above it (blank
    lines between are allowed), its code de-indented as in a list item."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.group(1), opening.group(2)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line
                         for line in lines[i + 1:end])
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.search(above)
        blocks.append(Block(path, i + 1, lang, marker.group(1) if marker else None,
                            (marker.group(2) or "") if marker else "", code + "\n"))
        i = end + 1
    return blocks


def shell_blocks(root: Path = ROOT) -> list[Block]:
    return [b for f in doc_files(root) for b in fenced_blocks(f) if b.lang in ("bash", "sh")]


def test_every_shell_block_is_marked_quick_or_skipped_with_a_reason() -> None:
    blocks = shell_blocks()
    unmarked = [str(b) for b in blocks if b.kind is None]
    assert not unmarked, f"mark these blocks <!-- docs-test: quick|skip: reason -->: {unmarked}"
    no_reason = [str(b) for b in blocks if b.kind == "skip" and not b.reason]
    assert not no_reason, f"a skipped block says why: {no_reason}"
    assert sum(b.kind == "quick" for b in blocks) >= 4


def test_the_marker_parser_reads_indented_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("1. step\n\n   <!-- docs-test: skip: needs docker -->\n   ```bash\n"
                   "   echo a \\\n       b\n   ```\n\n```bash\necho c\n```\n")
    first, second = fenced_blocks(doc)
    assert (first.kind, first.reason, first.code) == ("skip", "needs docker",
                                                      "echo a \\\n    b\n")
    assert (second.kind, second.line) == (None, 9)


def fresh_copy(dest: Path) -> Path:
    """The tracked and unignored files of this checkout as a new git repository (what
    a clone of a commit of the working tree would hold)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        src = ROOT / name
        if src.is_file():  # skips files deleted but not yet committed, and submodules
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git = ["git", "-C", str(dest), "-c", "user.name=docs-test", "-c",
           "user.email=docs-test@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "fresh copy"], check=True)
    return dest


def tool_shims(bin_dir: Path, project: Path) -> Path:
    """``fedqhd`` and ``python`` that import the copy's ``fedqhd`` first, also when a
    documented command sets its own PYTHONPATH (as an installed project would)."""
    bin_dir.mkdir(parents=True)
    # the copy's own entry point ([project.scripts]), not the venv's installed script:
    # that one names the entry point of whatever checkout was installed
    entry = tomllib.loads((project / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = entry["fedqhd"].partition(":")
    fedqhd = (f'"{sys.executable}" -c "import sys; from {module} import {function}; '
              f'sys.argv[0] = \'fedqhd\'; sys.exit({function}())"')
    for name, target in (("fedqhd", fedqhd), ("python", f'"{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nPYTHONPATH="{project}${{PYTHONPATH:+:$PYTHONPATH}}" '
                        f'exec {target} "$@"\n')
        shim.chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_quick_documented_commands_run_in_order_from_a_fresh_copy(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    project = fresh_copy(tmp_path / "project")
    home = tmp_path / "home"
    home.mkdir()
    shims = tool_shims(tmp_path / "shims", project)
    env = {"PATH": os.pathsep.join([str(shims), str(Path(sys.executable).parent),
                                    "/usr/local/bin", "/usr/bin", "/bin"]),
           "HOME": str(home), "FEDQHD_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "LANG": "C.UTF-8",
           "FLWR_TELEMETRY_ENABLED": "0"}
    quick = [b for b in shell_blocks(project) if b.kind == "quick"]
    timings = []
    for block in quick:
        started = time.monotonic()
        # the script on stdin, not in argv: a documented `pgrep -f` must not find it
        done = subprocess.run(["bash", "-e", "-s"], input=block.code, cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
        timings.append(f"{block.path.name}:{block.line} {time.monotonic() - started:.1f}s")
        assert done.returncode == 0, (f"{block.path.relative_to(project)}:{block.line} "
                                      f"exited {done.returncode}\n{block.code}\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    print("; ".join(timings))
    status = subprocess.run(["git", "-C", str(project), "status", "--porcelain",
                             "--untracked-files=all"], capture_output=True, text=True,
                            check=True).stdout
    assert status == "", f"the documented commands left files git would commit:\n{status}"
    assert (project / "creds" / "supernode-1" / "supernode.key").is_file()
    assert (project / "shards" / "shard-4.npz").is_file()
