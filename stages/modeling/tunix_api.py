"""The Tunix names that differ between the tested release and Tunix's main branch, in one place.

Tunix's main branch renames RLCluster to RLEngine (RLCluster stays as an alias), renames the
learners' `rl_cluster=` keyword to `rl_engine=` (the old one still accepted, with a logged
deprecation), and moves `compute_entropy_from_logits` from tunix.rl.algo_core to
tunix.rl.common. FAR reads these names from here only, so that running on either Tunix is an
import, not an edit (docs/tunix-main.md; bench/tunix_tree_check.sh reruns the comparison).

The gate is the new name's presence, not the version string: Tunix's main branch says 0.1.8
long before a 0.1.8 release, so the version cannot tell the two apart. On the tested release
every name here is the very object FAR used before. Importing this module reads Tunix and
changes nothing in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunix.rl import algo_core
from tunix.rl import common as rl_common
from tunix.rl import rl_cluster as rl_cluster_lib

RENAMED_TO_ENGINE = hasattr(rl_cluster_lib, "RLEngine")
"""Whether the installed Tunix has RLEngine (its main branch) rather than RLCluster only."""

if TYPE_CHECKING:  # type-checked against the tested release, whose only name is RLCluster
    from tunix.rl.rl_cluster import RLCluster as RLEngine
else:
    RLEngine = rl_cluster_lib.RLEngine if RENAMED_TO_ENGINE else rl_cluster_lib.RLCluster
    """The class that holds a GRPO run's actor, reference and rollout models."""

RLCluster = RLEngine
"""The tested release's name for RLEngine."""

LEARNER_ENGINE_ARG = "rl_engine" if RENAMED_TO_ENGINE else "rl_cluster"
"""The keyword an RL learner (GRPOLearner, DAPO, Dr. GRPO) takes its RLEngine by."""

ENTROPY_MODULE: Any = (  # a module; Any, as FAR swaps its function (fast_paths)
    algo_core if hasattr(algo_core, "compute_entropy_from_logits") else rl_common
)
"""The module whose `compute_entropy_from_logits` Tunix's losses read at each call."""
