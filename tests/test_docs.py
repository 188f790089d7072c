"""The README stays a short front page whose links resolve, and the results it and the docs cite
are the files in ``benchmarks/results/``, both ways: every file there is cited by a docs table,
and every cited path exists (or, written ``git show <commit>:benchmarks/results/...``, exists at
that commit). The docs site itself is built in strict mode by ``./scripts/test`` (mkdocs.yml)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"
README_MAX_LINES = 250

# [text](target) outside code; images too. Targets with a scheme are external and not checked.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A results path as the docs write it; a `<commit>:` just before it makes it a git-history citation.
RESULT_PATH = re.compile(r"(?:([0-9a-f]{7,40}(?:~\d+)?):)?benchmarks/results/([\w./-]*[\w])")
RESULT_NAME = re.compile(r"[\w.-]+\.(?:json|png)\b")
# A file name with the folders written before it (benchmarks/data/utterance_lengths.json).
FILE_REF = re.compile(r"(?:[\w.~-]+[/:])*[\w.-]+\.(?:json|png)\b")


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md is {lines} lines (at most {README_MAX_LINES}): move reference into docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M)
    first = blocks[0].splitlines() if blocks else []
    assert [line.split()[0] for line in first] == ["./scripts/serve", "./scripts/test"], first


def test_the_readme_links_resolve() -> None:
    text = _without_code_blocks(README.read_text())
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert targets, "the README links to no docs page"
    missing = []
    for target in targets:
        path, _, anchor = target.partition("#")
        if not path:
            continue  # an anchor in the README itself: GitHub resolves it, nothing to check here
        if not (REPO / path).exists():
            missing.append(target)
        elif anchor and path.endswith(".md"):
            headings = re.findall(r"^#+ (.+)$", _without_code_blocks((REPO / path).read_text()), re.M)
            if anchor not in {_slug(h) for h in headings}:
                missing.append(target)
    assert not missing, f"README links to what does not exist: {missing}"


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs' toc both give a heading of plain words (punctuation dropped)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s+", "-", text)


def test_the_readme_names_where_a_newcomer_looks_first() -> None:
    """The WebSocket message list, the speech API's fields, the GPU serve command and the deployment
    recipe are each one link from the README's first screen."""
    head = "\n".join(README.read_text().splitlines()[:40])
    for target in (
        "docs/protocol.md#messages",
        "docs/http-api.md#fields",
        "docs/gpu-serving.md#serve",
        "docs/deployment.md#behind-nginx-under-voice",
    ):
        assert f"({target})" in head, f"the README's first screen does not link {target}"


def _citations() -> list[tuple[Path, str | None, str]]:
    """(page, commit or None, path under benchmarks/results/) for every results path in the README
    and the docs."""
    found = []
    for page in [README, *_doc_pages()]:
        for commit, rel in RESULT_PATH.findall(page.read_text()):
            found.append((page, commit or None, rel))
    return found


def test_every_cited_results_file_exists() -> None:
    missing = [
        f"{page.relative_to(REPO)}: benchmarks/results/{rel}"
        for page, commit, rel in _citations()
        if commit is None and not (RESULTS / rel).exists()
    ]
    # Bare file names on the results page are citations too (the tables name files that way).
    results_page = _without_code_blocks((DOCS / "results.md").read_text())
    history = {rel for _, commit, rel in _citations() if commit is not None}
    for ref in FILE_REF.findall(results_page):
        if ":" in ref or "/" in ref:
            exists = ":" in ref or (REPO / ref).exists()  # a git-history path is checked below
        else:
            exists = (RESULTS / ref).exists() or any(h.endswith("/" + ref) or h == ref for h in history)
        if not exists:
            missing.append(f"docs/results.md: {ref}")
    assert not missing, f"cited but not in benchmarks/results/: {sorted(set(missing))}"


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git history")
def test_every_results_file_cited_from_git_history_is_there() -> None:
    missing = []
    for page, commit, rel in _citations():
        if commit is None:
            continue
        spec = f"{commit}:benchmarks/results/{rel}"
        if subprocess.run(["git", "cat-file", "-e", spec], cwd=REPO, capture_output=True).returncode != 0:
            missing.append(f"{page.relative_to(REPO)}: {spec}")
    assert not missing, f"not in git history: {missing}"


def test_every_results_file_is_cited_by_a_results_table() -> None:
    cited: set[str] = set()
    for line in _without_code_blocks((DOCS / "results.md").read_text()).splitlines():
        if line.startswith("|"):
            # a file named only through git history (`<commit>:benchmarks/results/x.json`) is not a
            # citation of the current file
            line = RESULT_PATH.sub(lambda m: "" if m.group(1) else m.group(0), line)
            cited.update(RESULT_NAME.findall(line))
    files = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file())
    uncited = [f for f in files if f not in cited and Path(f).name not in cited]
    assert not uncited, (
        f"benchmarks/results/ holds files no table of docs/results.md cites: {uncited}. Cite each in a row, "
        "or git rm it and name it in docs/performance-history.md (file, finding, the commit that has it)"
    )
