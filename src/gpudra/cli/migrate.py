"""`gpudra migrate FILE...`: manifests written for NVIDIA's DRA driver or device plugin, rewritten for
gpudra (`gpudra.migrate.translation` decides what becomes what). I/O: the files named (read by
`gpudra.cli.manifest_files`, bounded; `-` is standard input), the device plugin's config, stdout and
stderr.

The output is the input with each object that changes written anew, and every other document, comment
and blank line as it was, byte for byte: the text is cut at its document markers
(`manifest_files.document_texts`) and only the documents that change are written again. A rewritten
document keeps the comments above and below it (Helm's `# Source:` lines); comments inside it are lost.
The ResourceClaimTemplates a workload needs are written just before it, once per namespace and shape
over all the files.

What has no gpudra equivalent is left as it was and listed on stderr (file, object, field, why).
Exit codes: 0 when the output is complete; 1 when something was left as it was (the output is still
written); 2 when a file or the device plugin's config cannot be read or parsed, or the command line is
wrong.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpudra.cli.manifest_files import STDIN, Documents, NodeBudget, document_texts, parse_documents, read_text
from gpudra.errors import ConfigError
from gpudra.migrate.translation import (
    DevicePlugin,
    MigStrategy,
    TranslationOptions,
    device_plugin_config,
    label,
    translate,
)
from gpudra.model.manifests import Problem

EXIT_INCOMPLETE = 1
_LINE = re.compile(r"[^\n]*\n|[^\n]+$")
OPTION = "--device-plugin-config"


@dataclass
class Migrated:
    """All files' output, and what was left as it was or should be known."""

    text: str = ""
    untranslated: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    made: set[tuple[str | None, str]] = field(default_factory=set)


def run(
    paths: Sequence[Path],
    *,
    driver: str,
    device_plugin: Path | None,
    mig_strategy: MigStrategy | None,
    gpu_memory: int | None,
    by_count: bool = False,
) -> int:
    """Writes the gpudra manifests to stdout and what was not translated to stderr; the exit code as the
    module says. ConfigError (exit 2) for a file that cannot be used."""
    plugin = read_device_plugin(device_plugin, mig_strategy=mig_strategy)
    options = TranslationOptions(
        driver=driver, device_plugin=plugin, gpu_memory=gpu_memory, by_count=by_count
    )
    texts = [(_name(path), _text(path)) for path in paths]  # every file read before a line is written
    migrated = Migrated()
    for file, text in texts:
        migrate_text(file, text, options, migrated, json_text=file.endswith(".json"))
    sys.stdout.write(migrated.text)
    for note in migrated.notes:
        print(f"gpudra migrate: note: {note}", file=sys.stderr)
    for problem in migrated.untranslated:
        print(f"gpudra migrate: not translated: {problem}", file=sys.stderr)
    if migrated.untranslated:
        count = len(migrated.untranslated)
        print(f"gpudra migrate: {count} part(s) left as they were: the output is incomplete", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


def read_device_plugin(path: Path | None, *, mig_strategy: MigStrategy | None) -> DevicePlugin | None:
    """The device plugin's config file (or the ConfigMap of its chart, holding one), checked."""
    if path is None:
        return DevicePlugin(mig_strategy=mig_strategy) if mig_strategy else None
    where = f"{OPTION}: {_name(path)}"
    try:
        documents = [d for d in parse_documents(read_text(path)).documents if d is not None]
    except ValueError as err:
        raise ConfigError(str(err), field=where) from None
    if len(documents) != 1:
        raise ConfigError(f"holds {len(documents)} documents; the device plugin's config is one", field=where)
    config = documents[0]
    if isinstance(config, Mapping) and config.get("kind") == "ConfigMap":
        data = config.get("data")
        if not isinstance(data, Mapping) or len(data) != 1:
            raise ConfigError(
                "a ConfigMap of the device plugin's config must hold one entry in data", field=where
            )
        (key, inner), *_ = data.items()
        try:
            documents = [d for d in parse_documents(str(inner)).documents if d is not None]
        except ValueError as err:
            raise ConfigError(str(err), field=f"{where}: data.{key}") from None
        config = documents[0] if len(documents) == 1 else None
    try:
        return device_plugin_config(config, mig_strategy=mig_strategy)
    except ConfigError as err:
        raise ConfigError(str(err), field=where) from None


def migrate_text(
    file: str, text: str, options: TranslationOptions, migrated: Migrated, *, json_text: bool = False
) -> None:
    """One file's text, migrated, added to `migrated.text`."""
    if json_text:
        try:
            parsed: list[tuple[str, Documents | None]] = [(text, parse_documents(text, json_text=True))]
        except ValueError as err:
            raise ConfigError(str(err), field=file) from None
    else:
        parsed = _pieces(file, text)
    for _, found in parsed:
        for skipped in found.skipped if found is not None else ():
            migrated.untranslated.append(Problem(file, skipped.where, "", f"left out: {skipped.reason}"))
    output = []
    for piece, found in parsed:
        documents = [d for d in found.documents if d is not None] if found is not None else []
        if len(documents) != 1 or not isinstance(documents[0], Mapping):
            output.append(piece)  # nothing to translate, or a piece the cut could not separate
            continue
        output.append(_migrated_piece(file, piece, documents[0], options, migrated))
    _append(migrated, "".join(output))


def _pieces(file: str, text: str) -> list[tuple[str, Documents | None]]:
    """Each document's text (`document_texts`) with what it holds, each parsed once, the bounds over
    the whole file. A piece the cut could not separate (a %YAML directive) holds None, to be written as
    it was; then the whole file is parsed, to tell such a piece from a file that is not YAML."""
    budget, first = NodeBudget(), 1
    parsed: list[tuple[str, Documents | None]] = []
    for piece in document_texts(text):
        try:
            found = parse_documents(piece, budget=budget, first=first)
        except ValueError:
            parsed.append((piece, None))
            continue
        first += len(found.documents)
        parsed.append((piece, found))
    if any(found is None for _, found in parsed):
        try:
            parse_documents(text)
        except ValueError as err:
            raise ConfigError(str(err), field=file) from None
    return parsed


def _migrated_piece(
    file: str, piece: str, obj: Mapping[str, Any], options: TranslationOptions, migrated: Migrated
) -> str:
    done = translate(obj, options, migrated.made)
    named = label(obj)
    migrated.untranslated += [Problem(file, u.object or named, u.field, u.reason) for u in done.untranslated]
    migrated.notes += [Problem(file, n.object or named, n.field, n.reason) for n in done.notes]
    if done.obj is None and not done.added:
        return piece
    lines = _LINE.findall(piece)
    head = ""
    if lines and lines[0].startswith("---"):
        first = lines.pop(0)
        rest = first[3:].strip()
        head = first if not rest or rest.startswith("#") else "---\n"
    lead: list[str] = []
    while lines and _comment_or_blank(lines[0]):
        lead.append(lines.pop(0))
    tail: list[str] = []
    while lines and (_comment_or_blank(lines[-1]) or lines[-1].startswith("...")):
        tail.insert(0, lines.pop())
    added = "".join(f"{_dump(t)}---\n" for t in done.added)
    body = _dump(done.obj if done.obj is not None else obj)
    return head + added + "".join(lead) + body + "".join(tail)


def _comment_or_blank(line: str) -> bool:
    return line.strip() == "" or line.startswith("#")


def _append(migrated: Migrated, text: str) -> None:
    """Another file's output after the last: on a line of its own, a document of its own."""
    if migrated.text and text:
        if not migrated.text.endswith("\n"):
            migrated.text += "\n"
        if not text.startswith("---"):
            migrated.text += "---\n"
    migrated.text += text


def _dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)


def _text(path: Path) -> str:
    try:
        return read_text(path)
    except ValueError as err:
        raise ConfigError(str(err), field=_name(path)) from None


def _name(path: Path) -> str:
    return "(standard input)" if path == STDIN else str(path)
