"""Plugin modules: a user's Python module that registers stage kinds (stages.registry.register)
and/or rewards (@stages.rewards.reward), imported before a recipe that names them is read.

A run gets them from `--plugin MODULE` on the command line or from the recipe's `plugins:`
list (what a scheduled deployment, which has no command line, uses); run.json records the
modules a run used, so `far resume` (the user continuing their own run) imports them in a
later process. `far status`, `audit` and `lineage` never import them: they read a run as
data (pipeline/plugin_check.py). The two registries live in stages/ (the stage registry
imports no reward), so this module, which sees both, is the one place that says what a plugin
registered.

Anything that goes wrong while importing one (no such module, a syntax error, a kind or reward
it registers twice, an exception or sys.exit on import, an entry point of a kind it added
that cannot be imported, or a module that registers nothing) is a PluginError naming it:
before any compute, and leaving nothing it registered behind.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.dag import build_dag, node_config
from schemas.recipe import EvalConfig, GRPOConfig, Recipe, SelfTeachConfig
from stages import registry, rewards
from stages.core.errors import InputError
from stages.registry import PluginError

GUIDE = "docs/adding-a-stage.md, docs/your-own-task.md"


@dataclass(frozen=True)
class Registered:
    """What a plugin module added: stage kinds and rewards."""

    kinds: tuple[str, ...] = ()
    rewards: tuple[str, ...] = ()

    def __str__(self) -> str:
        said = [f"stage kinds {list(self.kinds)}"] if self.kinds else []
        said += [f"rewards {list(self.rewards)}"] if self.rewards else []
        return " and ".join(said) or "nothing"


LOADED: dict[str, Registered] = {}
"""What each plugin module registered when this process imported it (as sys.modules holds
the modules): a module whose kinds or rewards live in other modules of the user's is still
known as a plugin when --plugin, the recipe's plugins and run.json name it again."""


def load_plugin(module: str, where: str | None = None) -> Registered:
    """Import `module`, which registers its stage kinds and rewards as it is imported; what it
    added. `where` names it in errors (default `--plugin MODULE`). A module imported already
    (by an earlier --plugin, or the recipe's plugins too) is not imported again: it counts
    when this process imported it as a plugin before (LOADED), or when a kind or reward of
    it (or of a module under it) is registered."""
    where = where or f"--plugin {module}"
    if not module.strip():
        raise PluginError(
            f"{where}: empty module name; expected a dotted module on the Python path that "
            f"registers a stage kind or a reward ({GUIDE})"
        )
    if module in sys.modules:
        found = LOADED.get(module) or _registered_by(module)
    else:
        found = _import_new(module, where)
    if not found.kinds and not found.rewards:
        raise PluginError(
            f"{where}: importing it registered no stage kind and no reward (kinds: "
            f"{sorted(registry.REGISTRY)}; rewards: {sorted(rewards.REGISTRY)}); expected a "
            f"module that calls stages.registry.register or @stages.rewards.reward ({GUIDE})"
        )
    return found


def load_plugins(modules: Sequence[str], where: str) -> None:
    """The recipe's `plugins`, each loaded as by --plugin; `where` names the field."""
    for index, module in enumerate(modules):
        load_plugin(module, f"{where}[{index}] {module!r}")


def import_plugins(modules: Iterable[str]) -> None:
    """Import a run's recorded plugin modules for `far resume` (each registers its kinds and
    rewards once; one imported already is not imported again); PluginError names one that
    fails. Never for reading a run (status, audit, lineage): run.json is storage."""
    for module in modules:
        if module not in sys.modules:
            _import_new(module, f"plugin {module} (recorded in run.json)")


def recorded_modules(recipe: Recipe) -> list[str]:
    """The plugin modules a run of `recipe` uses, as run.json records them: the recipe's own
    `plugins`, the modules of the stage kinds FAR does not ship and of the user's rewards its
    nodes name."""
    dag = build_dag(recipe)
    builtin = {spec.kind for spec in registry.BUILTIN}
    kinds = {n.kind for n in dag.nodes if n.kind in registry.REGISTRY} - builtin
    names = {n for node in dag.nodes for n in reward_names(node_config(recipe, node))}
    names = {n for n in names if n in rewards.REGISTRY} - rewards.BUILTIN
    found = {_loaded_by(k, "kinds") or registry.REGISTRY[k].module for k in kinds}
    found |= {_loaded_by(n, "rewards") or rewards.REGISTRY[n].module for n in names}
    return sorted({*recipe.plugins, *found})


def _loaded_by(name: str, what: str) -> str | None:
    """The plugin module whose import registered kind or reward `name` (it may be defined in
    another module of the user's, which alone would not register it)."""
    for module, found in LOADED.items():
        if name in getattr(found, what) and module in sys.modules:
            return module
    return None


def reward_names(config: object) -> list[str]:
    """The rewards a node's config names: GRPO's weights, an evaluation's extra rewards, a
    self_teach node's verify list."""
    if isinstance(config, GRPOConfig):
        return list(config.rewards)
    if isinstance(config, EvalConfig):
        return list(config.rewards)
    if isinstance(config, SelfTeachConfig):
        return list(config.verify)
    return []


def _registered_by(module: str) -> Registered:
    def own(name: str) -> bool:
        return name == module or name.startswith(module + ".")

    kinds = tuple(sorted(k for k, s in registry.REGISTRY.items() if own(s.module)))
    added = tuple(sorted(n for n, r in rewards.REGISTRY.items() if own(r.module)))
    return Registered(kinds, added if module != rewards.__name__ else ())


def _import_new(module: str, where: str) -> Registered:
    kinds, names = set(registry.REGISTRY), set(rewards.REGISTRY)
    try:
        _import(module, where)
        found = Registered(
            tuple(sorted(set(registry.REGISTRY) - kinds)),
            tuple(sorted(set(rewards.REGISTRY) - names)),
        )
        for kind in found.kinds:
            registry.check_entry(where, registry.REGISTRY[kind])
        LOADED[module] = found
    except PluginError:
        for kind in set(registry.REGISTRY) - kinds:  # a refused plugin leaves nothing behind
            registry.REGISTRY.pop(kind)
        for name in set(rewards.REGISTRY) - names:
            rewards.REGISTRY.pop(name)
        sys.modules.pop(module, None)
        raise
    return found


def _import(module: str, where: str) -> None:
    """Import a plugin module from the Python path, or else from the directory `far` was
    started in (as `python -m` would: a user's my_reward.py beside the recipe needs no
    PYTHONPATH); that directory goes last on the path, so it never shadows an installed
    package or the standard library. Only `far run`, `validate` and `resume` import plugins:
    the user's own code, named by their command line, recipe or own run."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        importlib.import_module(module)
    except InputError as e:  # a kind or a reward it registers twice
        raise PluginError(f"{where}: {e}") from e
    except ImportError as e:
        raise PluginError(
            f"{where}: cannot import it ({e}); expected a module on the Python path that "
            f"registers a stage kind or a reward ({GUIDE})"
        ) from e
    except SyntaxError as e:
        raise PluginError(f"{where}: syntax error at {e.filename}:{e.lineno}: {e.msg}") from e
    except SystemExit as e:
        raise PluginError(
            f"{where}: importing it called sys.exit({e.code!r}); a plugin module must only "
            f"define and register its stage kinds and rewards"
        ) from e
    except Exception as e:
        raise PluginError(f"{where}: importing it raised {type(e).__name__}: {e}") from e
