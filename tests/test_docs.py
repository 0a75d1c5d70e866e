"""The docs name only files that exist: every repository path in backticks in the architecture
page and the README is checked against the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOP = (
    "engine",
    "gateway",
    "tenancy",
    "quotas",
    "migrations",
    "tests",
    "configs",
    "benchmarks",
    "docs",
    ".ci",
)
# `a/b.py`, `gateway/api/`, `configs/fairlane.yaml`: a top-level folder, then path characters; no
# templates ({model}), globs (*) or options.
PATH = re.compile(r"`((?:{})/[A-Za-z0-9_./-]*)`".format("|".join(re.escape(t) for t in TOP)))


def named_paths(doc: Path) -> list[str]:
    return sorted(set(PATH.findall(doc.read_text())))


@pytest.mark.parametrize(
    "doc", ["docs/architecture.md", "README.md", "docs/structures.md", "docs/gateway.md", "docs/api.md"]
)
def test_every_path_a_doc_names_exists(doc):
    paths = named_paths(REPO / doc)
    assert paths, f"{doc} names no repository path (the pattern is broken)"
    missing = [p for p in paths if not (REPO / p.rstrip("/")).exists()]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_the_readme_links_the_architecture_page_and_nothing_outside_the_repository():
    readme = (REPO / "README.md").read_text()
    assert "docs/architecture.md" in readme
    assert "shared/" not in readme and "../" not in readme
