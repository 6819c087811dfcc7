"""Every link in the project's Markdown leads somewhere inside the repository: a relative link names a
file or directory that exists (and a heading there, for `#anchor`), never a path above the checkout;
a link to outside the repository is allowed only to the upstream sources a document cites for a fact
(ALLOWED, each with its reason), so that the docs neither rot nor send a reader away for what the
project itself should say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SKIP_DIRS = {".git", ".venv", "build", "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache"}

# Links to outside the repository that a document may keep, by prefix, and why.
ALLOWED = {
    # docs/health.md: NVIDIA's XID catalog and memory-error documents, the sources of the XID classes
    # and their defaults (the facts are restated in the doc; the links say where they come from).
    "https://docs.nvidia.com/deploy/": "NVIDIA's XID and ECC documentation, cited by docs/health.md",
    # docs/migrate.md: the exact upstream files (pinned to a tag or commit) whose field names and
    # defaults the migration tables translate, so a reader can check each row.
    "https://github.com/NVIDIA/k8s-device-plugin/blob/v": "the device plugin's sources at a release tag",
    "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/blob/": "NVIDIA's DRA driver at a commit",
    # docs/migrate.md: the Kubernetes sources and KEPs behind the extended-resource mapping's rules.
    "https://github.com/kubernetes/kubernetes/blob/v": "Kubernetes' sources at a release tag",
    "https://github.com/kubernetes/api/blob/v": "the API types at a release tag",
    "https://www.kubernetes.dev/resources/keps/": "the KEPs that define the features",
}

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_INLINE = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)  # [label]: target
_BARE = re.compile(r"<?(https?://[^\s>)]+)")


def _markdown_files() -> list[Path]:
    found = []
    for path in sorted(REPO.rglob("*.md")):
        if not SKIP_DIRS.intersection(path.relative_to(REPO).parts):
            found.append(path)
    return found


def _prose(text: str) -> str:
    """The text without code blocks and inline code, where URLs are examples, not links."""
    return _CODE.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    """Every link target in Markdown `text`: inline, reference-style and bare URLs outside code."""
    prose = _prose(text)
    targets = _INLINE.findall(prose) + _REFERENCE.findall(prose)
    bare = [url for url in _BARE.findall(prose) if url not in targets]
    return targets + bare


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes for a Markdown file's headings: lower case, punctuation other than
    hyphens and underscores dropped, spaces as hyphens; a repeated heading gets -1, -2, ... Also the
    explicit ones, `<a id="...">`."""
    found: set[str] = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", _FENCE.sub("", text), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def problem(source: Path, target: str) -> str | None:
    """What is wrong with the link `target` in `source`, or None."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):
        if target.startswith("mailto:"):
            return f"{target}: an e-mail address"
        if any(target.startswith(prefix) for prefix in ALLOWED):
            return None
        return f"{target}: a link outside the repository (say it here, or add it to ALLOWED with why)"
    path_part, _, anchor = target.partition("#")
    resolved = (source.parent / path_part).resolve() if path_part else source
    if not resolved.is_relative_to(REPO):
        return f"{target}: leads outside the repository"
    if not resolved.exists():
        return f"{target}: {resolved.relative_to(REPO)} does not exist"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
        return f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}"
    return None


def test_the_markdown_files_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _markdown_files()}
    assert {"README.md", "docs/troubleshooting.md", "docs/gpu-operator.md", "docs/development.md"} <= names


@pytest.mark.parametrize("source", _markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_leads_inside_the_repository(source: Path) -> None:
    found = [problem(source, target) for target in links(source.read_text())]
    assert [p for p in found if p] == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    source = REPO / "README.md"
    assert problem(source, "docs/install.md#requirements") is None
    assert problem(source, "docs/install.md#no-such-heading") is not None
    assert problem(source, "docs/missing.md") is not None
    assert problem(source, "../outside.md") is not None
    assert problem(source, "https://example.com/page") is not None
    assert problem(source, "https://docs.nvidia.com/deploy/xid-errors/") is None
    assert links("see [a](x.md), `[b](y.md)` and <https://example.com>\n```\n[c](z.md)\n```\n") == [
        "x.md",
        "https://example.com",
    ]
    assert anchors("# Keeping `nvidia.com/gpu` pod specs working\n## Install\n## Install\n") == {
        "keeping-nvidiacomgpu-pod-specs-working",
        "install",
        "install-1",
    }
