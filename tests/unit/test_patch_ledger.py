"""The patch ledger (stages/modeling/patches/ledger.py): each entry names code and a test that
exist, an upstream issue or the report to file, and the upstream behaviours it answers are
still there. The tests below that show upstream behaviour fail once upstream changes it: the
ledger entry naming them is then to be removed or re-checked."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import jax
import pytest
from tunix.models.gemma3 import model as gemma3_model
from tunix.rl import rl_cluster, rl_learner
from tunix.rl.rollout import vanilla_rollout
from tunix.sft import metrics_logger

from stages.modeling.patches.ledger import LEDGER, Patch, by_id

REPO = Path(__file__).resolve().parents[2]


def test_ids_are_unique() -> None:
    assert len(by_id()) == len(LEDGER)


@pytest.mark.parametrize("patch", LEDGER, ids=lambda p: p.id)
def test_each_entry_names_real_code_and_a_real_test(patch: Patch) -> None:
    module, _, name = patch.code.partition(":")
    assert hasattr(importlib.import_module(module), name), patch.code
    path, _, test = patch.test.partition("::")
    source = REPO / path
    assert source.is_file(), patch.test
    if test:
        functions = {
            node.name
            for node in ast.walk(ast.parse(source.read_text()))
            if isinstance(node, ast.FunctionDef)
        }
        assert test in functions, patch.test


@pytest.mark.parametrize("patch", LEDGER, ids=lambda p: p.id)
def test_each_entry_links_its_issue_or_carries_its_report(patch: Patch) -> None:
    assert (patch.upstream is None) != (patch.report is None), patch.id
    if patch.upstream is not None:
        assert patch.upstream.startswith("https://github.com/"), patch.upstream
    assert patch.versions and patch.remove_when and patch.why and patch.targets


def test_tunix_fast_forwards_by_trainer_loops() -> None:
    """google/tunix#2290: RLLearner's resume target is the actor trainer's loop count (what
    skip_tunix_fast_forward zeroes). Fails once Tunix counts consumed micro-batches."""
    source = inspect.getsource(rl_learner.RLLearner.__init__)
    assert "self._last_iter_step = self.rl_cluster.actor_trainer.iter_steps" in source
    assert "_last_iter_step" in inspect.getsource(rl_learner.RLLearner._prepare_data)


def test_tunix_rollout_samples_every_call_with_one_seed() -> None:
    """VanillaRollout hands the config's one seed to every generate call (SeededRollout's
    reason). Fails once Tunix derives a seed per call."""
    source = inspect.getsource(vanilla_rollout.VanillaRollout.generate)
    assert "seed=rollout_config.seed" in source
    assert "fold_in" not in source and "split" not in source


def test_tunix_metrics_logger_close_removes_others_listeners(tmp_path: Path) -> None:
    """A listener registered by someone else is gone after a MetricsLogger closes, and
    unregistering it then raises (tunix_compat.unregister_duration_listener's reason)."""
    seen: list[str] = []

    def listener(event: str, duration: float, **kwargs: object) -> None:
        seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    logger = metrics_logger.MetricsLogger(
        metrics_logger.MetricsLoggerOptions(log_dir=str(tmp_path), flush_every_n_steps=1)
    )
    logger.close()
    jax.monitoring.record_event_duration_secs("/far/test/probe", 1.0)
    assert seen == []
    with pytest.raises(AssertionError):
        jax.monitoring.unregister_event_duration_listener(listener)


def test_the_private_attributes_far_reads_exist() -> None:
    """Private attributes FAR reads (rl-metrics-logger-private, gemma3-qk-norm-private): a
    rename upstream fails here first."""
    assert "self._rl_metrics_logger =" in inspect.getsource(rl_cluster.RLCluster.__init__)
    attention = inspect.getsource(gemma3_model.Attention.__init__)
    assert "self._query_norm =" in attention and "self._key_norm =" in attention


def swap_target(owner: object, name: str) -> str:
    """A swapped attribute as the ledger writes it: module.Name.attribute or module.attribute."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}.{name}"
    return f"{owner.__name__}.{name}"  # type: ignore[attr-defined]


def test_every_fast_path_swap_is_on_the_ledger_as_installed_per_stage() -> None:
    from stages.modeling import fast_paths

    swapped = {
        swap_target(swap.owner, swap.name)
        for paths in fast_paths.PATHS.values()
        for swap in paths()
    }
    staged = {target for patch in LEDGER if patch.installed == "stage" for target in patch.targets}
    assert swapped <= staged, swapped - staged
