"""Stage hashes of the bundled smoke recipes, pinned: a run resumes and skips by stage hash, so
a refactor of how a stage declares or hashes its config must leave every one of them where it
was. The values were computed on main before the stage registry (issue 27, item 4) existed;
upstream fingerprints are fixed stand-ins, so only the hashed config, model and code version
count. data_prep's is the one README.md prints for `far run recipes/smoke.yaml`.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.dag import build_dag, node_config
from pipeline.recipes import load_recipe
from stages import distill, dpo, evaluate, hard_subset, self_teach, sft
from stages.core.runner import StageIdentity
from stages.data_prep import build as data_prep
from stages.grpo import training as grpo

A, B, C = "a" * 64, "b" * 64, "c" * 64

PINNED = {
    "data_prep": "94166c1ee854d798ff30238aa7877aec2daffe444e2e7f8d7386888d3692021f",
    "sft": "8e3c756d93ce29161ef6f3668341292388e8b3d8e6dbc4ced5a76fdcce723927",
    "grpo": "41b746b9e5478f7401746956054dc92db68c166e4a47a9d52abdb56bb6bf0573",
    "evaluate": "030f999a55121c00e9c1fbe404970482b11fdbbc422c1270bdd50dcc84416e2f",
    "dag.evaluate_train": "bb50df4e5eac4a0bb0a5015515bdc173faba3f7ca0e6d4c62ca79a774586c215",
    "dag.hard": "1089d6b8dc56d0461984f78d1ddb3dd74967af7afc3ac9c51f3f96b528531bd5",
    "dag.self_teach": "49e3fd1f544251062be612487a2cd77334db32effa22e79950824c61590305d2",
    "dag.sft_self": "e29f2c74c0bc6ff26668c93747eaf15839235880e2ffb11d8af79532b7340c09",
    "dag.dpo": "c467f747e5a20ac52655ecd03b949d33840c521ef92296bb2ea3134bf4b14c95",
    "dag.orpo": "3a55cedf4646105a716a2143fb29346457483d2f9d6e1e7cfb3b0c4a0f8160ad",
    "dag.distill": "859be38e91004ec60a258e036d1961488218d62a305e64f50e6531c82c322f82",
}


def identities() -> dict[str, StageIdentity]:
    smoke = load_recipe("recipes/smoke.yaml", {}, ())
    dag = load_recipe("recipes/smoke-dag.yaml", {}, ())
    nodes = {n.id: n for n in build_dag(dag).nodes}

    def config(node_id: str) -> Any:
        return node_config(dag, nodes[node_id])

    student = config("distill").student or dag.model
    return {
        "data_prep": data_prep.identity(smoke.data, smoke.model),
        "sft": sft.identity(smoke.sft, smoke.model, A),
        "grpo": grpo.identity(smoke.grpo, smoke.model, A, B),
        "evaluate": evaluate.identity(smoke.eval, smoke.model, A, {"sft": B, "grpo": C}),
        "dag.evaluate_train": evaluate.identity(
            config("evaluate_train"),
            dag.model,
            A,
            {"grpo": C},
        ),
        "dag.hard": hard_subset.identity(config("hard"), A, B),
        "dag.self_teach": self_teach.identity(config("self_teach"), dag.model, A, B),
        "dag.sft_self": sft.identity(config("sft_self"), dag.model, A, B),
        "dag.dpo": dpo.identity(config("dpo"), dag.model, A, B),
        "dag.orpo": dpo.identity(config("orpo"), dag.model, A, B),
        "dag.distill": distill.identity(config("distill"), student, A, B),
    }


@pytest.mark.parametrize("name", sorted(PINNED))
def test_stage_hash_is_pinned(name: str) -> None:
    assert identities()[name].digest == PINNED[name]
