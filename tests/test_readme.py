"""README.md and docs/ say what the code is: the run-config page is generated from the one
definition of the keys, and README's "Code layout" names every top-level module and package
of ``fedqhd`` and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

from fedqhd.config import RUN_CONFIG_DOC_COMMAND, run_config_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_run_config_page_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "run-config.md").read_text()
    assert committed == run_config_markdown(), (
        f"docs/run-config.md is out of date; regenerate it: {RUN_CONFIG_DOC_COMMAND}")


def code_layout(readme: str) -> list[str]:
    """The paths the fenced block under README's "## Code layout" names in its left
    column (``name.py``, ``name/``, ``a.py, b.py``), relative to ``fedqhd/``."""
    section = readme.split("\n## Code layout", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "README's Code layout has no fenced block"
    lines = block.group(1).splitlines()
    assert lines[0].strip() == "fedqhd/", lines[0]
    names = []
    for line in lines[1:]:
        if not line.startswith("  ") or line.startswith("   ") or line.strip().startswith("--"):
            continue  # continuation lines of a description, and group headings
        left = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names += [n.strip() for n in left.split(",") if n.strip()]
    return names


def top_level(package: Path) -> set[str]:
    """``fedqhd``'s top-level modules (``x.py``) and packages (``x/``)."""
    return ({p.name for p in package.glob("*.py") if p.name != "__init__.py"}
            | {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()})


def test_code_layout_matches_the_tree() -> None:
    names = code_layout((ROOT / "README.md").read_text())
    package = ROOT / "fedqhd"
    missing = [n for n in names if not (package / n).exists()
               or (n.endswith("/") and not (package / n).is_dir())]
    assert not missing, f"README's Code layout names paths that do not exist: {missing}"
    named = {n.split("/", 1)[0] + ("/" if "/" in n else "") for n in names}
    unnamed = sorted(top_level(package) - named)
    assert not unnamed, f"README's Code layout leaves out: {unnamed}"


def test_code_layout_parser_reads_groups_and_continuations() -> None:
    readme = ("x\n## Code layout\n\n```\nfedqhd/\n  a.py, b/c.py   one\n"
              "                 more words\n  -- a group --\n  d/   two\n```\n## More\n")
    assert code_layout(readme) == ["a.py", "b/c.py", "d/"]
