"""tunix_api: the names FAR reads from whichever Tunix is installed (tested release or main)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import dapo_learner, drgrpo_learner, grpo_learner

from stages.modeling import tunix_api


def test_both_names_resolve_to_the_installed_tunix_class() -> None:
    """RLEngine and RLCluster are one class, the one the installed Tunix builds under its
    own name (RLEngine on main, RLCluster on the tested release)."""
    own = "RLEngine" if tunix_api.RENAMED_TO_ENGINE else "RLCluster"
    assert tunix_api.RLEngine is tunix_api.RLCluster
    assert tunix_api.RLEngine is getattr(rl_cluster_lib, own)
    assert tunix_api.RLEngine.__name__ == own
    assert rl_cluster_lib.RLCluster is tunix_api.RLEngine  # main keeps the alias too


def test_every_learner_takes_the_engine_by_the_named_keyword() -> None:
    """The keyword the GRPO stage passes its RLEngine by is a real parameter of each learner
    it builds (main's deprecated `rl_cluster` alias would only log)."""
    for learner in (
        grpo_learner.GRPOLearner,
        dapo_learner.DAPOLearner,
        drgrpo_learner.DrGRPOLearner,
    ):
        parameters = inspect.signature(learner.__init__).parameters
        assert list(parameters)[1] == tunix_api.LEARNER_ENGINE_ARG, learner


def test_the_entropy_module_holds_tunix_entropy() -> None:
    """ENTROPY_MODULE has Tunix's compute_entropy_from_logits: uniform logits over V tokens
    have entropy log V."""
    logits = jnp.zeros((2, 3, 8))
    entropy = tunix_api.ENTROPY_MODULE.compute_entropy_from_logits(logits)
    np.testing.assert_allclose(np.asarray(entropy), np.log(8.0), rtol=1e-6)


def test_importing_the_adapter_changes_nothing_in_tunix() -> None:
    """Every module attribute of the Tunix modules it reads is the same object before and
    after `import stages.modeling.tunix_api` (a fresh interpreter, so nothing else of FAR
    was imported first)."""
    script = textwrap.dedent(
        """
        from tunix.rl import algo_core, common, rl_cluster
        modules = (algo_core, common, rl_cluster)
        before = [dict(vars(m)) for m in modules]
        import stages.modeling.tunix_api
        changed = [
            f"{m.__name__}.{name}"
            for m, old in zip(modules, before)
            for name in set(vars(m)) | set(old)
            if vars(m).get(name, None) is not old.get(name, None)
        ]
        print(changed)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout + result.stderr
