"""What `far audit`, `far status` and `far lineage` make of a run's plugins: storage is data.

A run's run.json names the plugin modules it used, and the record of each stage that used a
user's reward holds the sha256 of the file that defined it (the stage identity's
"source:reward:NAME:MODULE" input). Reading a run never imports a module because the run
names it, and never puts the current directory on sys.path: whoever can write the run's
storage could otherwise run code in the auditor's process (and make the audit say anything).
Nothing here imports a plugin at all: the three commands read the run from data alone
(pipeline_order needs no kind's registration).

`--plugin MODULE` on these commands asks to check the caller's copy of a plugin against the
run: MODULE's file is located without executing it or its packages (on sys.path, then the
current directory: nothing found there runs), and its sha256 must be a digest that the run's
vouched records hold for MODULE. Otherwise a PluginError, exit 2. Every module the run names
that was not checked so is listed, with the rewards and digests its records hold, and so is
every stage kind of the run's recipe that FAR does not ship (a kind's code has no recorded
digest).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from pydantic import ValidationError

from pipeline import lineage
from pipeline.manifest import read_manifest
from schemas.recipe import Recipe
from schemas.record import RunManifest, StageRecord
from stages import registry
from stages.core.errors import MissingInput
from stages.core.identity import REWARD_SOURCE, SOURCE_PREFIX
from stages.registry import PluginError

CHECK_HINT = "check your copy of it with --plugin {module}"


@dataclass(frozen=True)
class RecordedCode:
    """A user's reward as a vouched record names it: the module that defined it and the
    sha256 of that module's file when the stage ran."""

    module: str
    reward: str
    digest: str


@dataclass(frozen=True)
class PluginReport:
    """What reading a run made of its plugins: the caller's copies checked, and the rest."""

    checked: list[str]
    unchecked: list[str]


def report(run_uri: str, modules: Sequence[str], doubts: Mapping[str, str]) -> PluginReport:
    """Check the caller's `--plugin` modules against the run's vouched records (`doubts`,
    from lineage.record_doubts, left out) and list what the run names that was not checked.
    A torn run.json is the audit's problem line, not an error here."""
    try:
        manifest: RunManifest | None = read_manifest(run_uri)
    except MissingInput:
        raise
    except ValueError:
        manifest = None
    recorded = recorded_code(lineage.run_records(run_uri, problems=[]), doubts)
    checked = check_plugins(modules, recorded)
    return PluginReport(checked, unchecked(manifest, recorded, modules))


def recorded_code(
    records: Iterable[tuple[str, StageRecord]], doubts: Mapping[str, str]
) -> list[RecordedCode]:
    """Every reward digest in the records the ledger vouches for (`doubts` left out)."""
    found = set()
    for record_uri, record in records:
        if record_uri in doubts:
            continue
        for name, digest in record.inputs.items():
            label = name.removeprefix(SOURCE_PREFIX)
            if name.startswith(SOURCE_PREFIX) and label.startswith(REWARD_SOURCE):
                reward, _, module = label.removeprefix(REWARD_SOURCE).partition(":")
                found.add(RecordedCode(module, reward, digest))
    return sorted(found, key=lambda c: (c.module, c.reward, c.digest))


def check_plugins(modules: Sequence[str], recorded: Sequence[RecordedCode]) -> list[str]:
    """One line per `--plugin MODULE` whose file matches a digest the run recorded for it;
    PluginError (exit 2) for one that is not found, or that the records do not vouch for."""
    lines = []
    for module in modules:
        where = f"--plugin {module}"
        path = locate(module, where)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        own = [c for c in recorded if c.module == module]
        if not own:
            held = ", ".join(_said(c) for c in recorded) or "none"
            raise PluginError(
                f"{where}: the run's records hold no digest for module {module!r} (they hold: "
                f"{held}), so its copy at {path} cannot be checked; FAR records the digest "
                f"of the module that defines a user's reward (a stage kind's module has "
                f"none); the audit, status and lineage of a run need no plugin"
            )
        if digest not in {c.digest for c in own}:
            raise PluginError(
                f"{where}: {path} has sha256 {digest}, but the run recorded "
                f"{', '.join(_said(c) for c in own)}: not the code the run used; "
                f"nothing of it was imported"
            )
        names = sorted({c.reward for c in own if c.digest == digest})
        lines.append(
            f"plugin {module}: {path} matches the digest the run recorded for reward(s) "
            f"{', '.join(names)} (sha256 {digest[:12]}); checked, not imported"
        )
    return lines


def unchecked(
    manifest: RunManifest | None, recorded: Sequence[RecordedCode], checked: Sequence[str]
) -> list[str]:
    """One line per plugin module the run names (run.json, or a record's reward) that no
    --plugin checked, and one for the stage kinds of its recipe that FAR does not ship."""
    named = set(manifest.plugins if manifest else ()) | {c.module for c in recorded}
    lines = []
    for module in sorted(named - set(checked)):
        own = [c for c in recorded if c.module == module]
        said = (
            ", ".join(f"reward {c.reward}, sha256 {c.digest[:12]}" for c in own)
            or "no reward digest"
        )
        lines.append(
            f"plugin {module}: not loaded and its code not checked (a run's records are read "
            f"as data, and nothing a run names is imported); recorded: {said}; "
            + CHECK_HINT.format(module=module)
        )
    kinds = _plugin_kinds(manifest)
    if kinds:
        lines.append(
            f"stage kinds {kinds}: not loaded (FAR does not ship them); their records were "
            f"checked as data, and a stage kind's code has no recorded digest to check"
        )
    return lines


def locate(module: str, where: str) -> Path:
    """The source file of `module`, found the way import would find it (sys.path, then the
    current directory) but without executing it or any package above it."""
    search: list[str] = [*sys.path, os.getcwd()]
    parts = module.split(".")
    spec: ModuleSpec | None = None
    for depth in range(len(parts)):
        name = ".".join(parts[: depth + 1])
        spec = PathFinder.find_spec(name, search) if all(parts) else None
        if spec is None:
            raise PluginError(
                f"{where}: no module {name!r} on the Python path or in the current directory; "
                f"expected the dotted name of the plugin's module file"
            )
        search = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None else None
    if origin is None or not Path(origin).is_file():
        raise PluginError(f"{where}: {module!r} has no source file to check (found {origin!r})")
    return Path(origin)


def _plugin_kinds(manifest: RunManifest | None) -> list[str]:
    """The kinds of the run's recipe nodes that FAR does not ship, read from run.json."""
    if manifest is None:
        return []
    try:
        pipeline = Recipe.model_validate(manifest.recipe).pipeline or []
    except ValidationError:
        return []
    shipped = {spec.kind for spec in registry.BUILTIN}
    return sorted({node.kind for node in pipeline} - shipped)


def _said(code: RecordedCode) -> str:
    return f"{code.module} (reward {code.reward}, sha256 {code.digest[:12]})"
