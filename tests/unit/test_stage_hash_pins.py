"""Stage hashes of the bundled smoke recipes, pinned: a run resumes and skips by stage hash, so
a refactor of how a stage declares or hashes its config must leave every one of them where it
was. The values were computed on main before the stage registry existed;
upstream fingerprints are fixed stand-ins, so only the hashed config, model and code version
count. data_prep's is the one docs/getting-started.md prints for `far run recipes/smoke.yaml`.

Moved on purpose since: evaluate and dag.evaluate_train by evaluate's STAGE_VERSION 4 -> 6
(sampled rows compared with sampled rows, by pass@1, intervals over prompts);
sft and dag.sft_self by sft's STAGE_VERSION 1 -> 3 (the loss at its loss positions, then
through the fused projection); grpo by grpo's STAGE_VERSION 4 -> 5 (log-probs through
the fused projection); grpo, evaluate, dag.evaluate_train and dag.self_teach by
grpo 5 -> 6, evaluate 6 -> 7 and self_teach 1 -> 2 (format_strict wants each tag once and
nothing after the answer but the end-of-turn marker); grpo by recipes/smoke.yaml's
rollouts at temperature 0.3 and 32 tokens instead of 0.9 and 24 (at 0.9 the tiny model samples
random bytes, so every reward was 0); evaluate and dag.evaluate_train by evaluate 7 -> 8 (a
text answer compared as text, not by math-verify, which graded a word's anagrams correct);
evaluate and dag.evaluate_train by evaluate 8 -> 9 (`steps: saved` scores the steps on each
stage's save grid only), and by evaluate 9 -> 10 (greedy batches of like-length prompts: a
kept batch of version 9 holds other prompts).
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.dag import build_dag, node_config
from pipeline.recipes import load_recipe
from stages import distill, dpo, hard_subset, self_teach, sft
from stages.core.runner import StageIdentity
from stages.data_prep import build as data_prep
from stages.evaluate import evaluation as evaluate
from stages.grpo import training as grpo

A, B, C = "a" * 64, "b" * 64, "c" * 64

PINNED = {
    "data_prep": "94166c1ee854d798ff30238aa7877aec2daffe444e2e7f8d7386888d3692021f",
    "sft": "8564c99b166313142789fd809f7f6517c3d68a3f1c7fc709be785c8521364d71",
    "grpo": "0858915d044739c99aaae3c0970adcfa7d942d8a984b24db12fb1d5472abcd9b",
    "evaluate": "efba6c6bd6657d54f3d9daec3d2cf51c76790813f1a42c26debd63c5e519039c",
    "dag.evaluate_train": "f0ef01c988a164fa3cc78136501248c0c6d372981d58e29aa3752cc920532d2a",
    "dag.hard": "1089d6b8dc56d0461984f78d1ddb3dd74967af7afc3ac9c51f3f96b528531bd5",
    "dag.self_teach": "53353562115d04e8c43d40cbee9748c1db5d95f92dab105f2e74e0bfb2f612d4",
    "dag.sft_self": "3b994e5073483090633d1bc76ac74eb817c62a73073f95eee6efbb5d6aa58c10",
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
