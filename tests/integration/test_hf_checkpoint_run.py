"""A real-layout Llama 3.2 checkpoint (saved by transformers: rope_scaling llama3, a byte-level
BPE tokenizer.json, Llama 3.2's own chat template) trains through every stage with
`template: tokenizer`, and both exports (merged and --adapter) reload in transformers / peft
with FAR's logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from schemas.recipe import MeshSpec
from schemas.recipe.data import PromptFormat
from stages import sft
from stages.core.runner import RunContext
from stages.core.shared import SharedBuilds
from stages.data_prep import build as data_prep
from stages.data_prep.build import chat_prompt
from stages.evaluate import evaluation as evaluate
from stages.grpo import training as grpo
from stages.modeling import models
from stages.modeling.hf_export import ExportOptions, export_checkpoint
from stages.modeling.tokenizers import build_tokenizer
from stages.rewards.answers import INSTRUCTIONS
from tests.conftest import recipe_with
from tests.hf_checkpoints import LLAMA32_TEMPLATE, write_checkpoint
from tests.integration.test_hf_checkpoints import _far_logits
from tests.load_checks import load_warnings

pytestmark = pytest.mark.slow  # every stage's compilations, two exports, three reloads

EOT = "<|eot_id|>"
TOKENIZER = PromptFormat(template="tokenizer")


def _instructed(question: str) -> str:
    return f"{INSTRUCTIONS[TOKENIZER.answer_format]}\n{question}"


def test_llama32_checkpoint_trains_every_stage_and_exports(
    tmp_path: Path, model_cache: str
) -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    import transformers

    directory = write_checkpoint("llama3", tmp_path / "llama32")
    recipe = recipe_with(
        str(tmp_path / "runs"),
        base="smoke-llama3",
        model={
            "source": "safetensors",
            "uri": str(directory),
            "tokenizer": "sentencepiece",
            "architecture": None,
        },
        data={
            "eval": {"size": 4},
            "grpo": {"size": 4},
            "sft": {"size": 16},
            "prompt": {"template": "tokenizer"},
            "max_seq_len": 320,
            "max_prompt_len": 256,
        },
        sft={"max_steps": 2, "checkpoint_every_steps": 2},
        grpo={"max_steps": 1, "num_generations": 2, "max_generation_tokens": 8},
        eval={"models": ["grpo"], "max_generation_tokens": 8, "batch_size": 4},
    )
    ctx = RunContext(str(tmp_path / "runs"), "llama", cache_dir=model_cache, shared=SharedBuilds())
    dataset = data_prep.prepare(recipe.data, recipe.model, ctx).output
    trained = sft.train(dataset, recipe.sft, recipe.model, recipe.mesh, ctx).output
    reinforced = grpo.reinforce(dataset, trained, recipe.grpo, recipe.model, recipe.mesh, ctx)
    checkpoint = reinforced.output
    report = evaluate.evaluate(
        dataset, {"grpo": checkpoint}, recipe.eval, recipe.model, recipe.mesh, ctx
    ).output
    assert [s.name for s in report.scores] == ["grpo"]

    tokenizer = build_tokenizer(checkpoint.model, model_cache)
    assert checkpoint.tokenizer == tokenizer.name and tokenizer.name.startswith("hf-")
    options = ExportOptions(template="tokenizer")
    merged = Path(export_checkpoint(checkpoint.uri, str(tmp_path / "merged"), model_cache, options))
    adapter = Path(
        export_checkpoint(
            checkpoint.uri,
            str(tmp_path / "adapter"),
            model_cache,
            ExportOptions(adapter=True, template="tokenizer"),
        )
    )
    config = json.loads((merged / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "llama3"
    assert config["rope_parameters"]["rope_theta"] == 500000.0

    mesh = models.build_mesh(MeshSpec())
    base = models.base_model(checkpoint.model, mesh, model_cache, ctx.shared, private=False)
    policy = models.policy_network(checkpoint, mesh, model_cache, ctx.shared, base=base)
    ids = [tokenizer.bos_id(), *tokenizer.encode("What is 3 + 4? " + EOT + " the answer")]
    with mesh:
        ours, unmerged = _far_logits(policy, ids), _far_logits(base, ids)
    load = transformers.AutoModelForCausalLM.from_pretrained
    with load_warnings() as caught, torch.no_grad():
        hf_merged = load(merged, dtype=torch.float32)(torch.tensor([ids])).logits[0].numpy()
    assert caught == []  # e.g. no complaint about the exported rope_parameters
    with torch.no_grad():
        with_adapter = peft.PeftModel.from_pretrained(
            load(adapter / "base", dtype=torch.float32), str(adapter)
        )
        hf_adapter = with_adapter(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(hf_merged, ours, atol=1e-4, rtol=0)
    np.testing.assert_allclose(hf_adapter, ours, atol=1e-4, rtol=0)
    assert np.abs(ours - unmerged).max() > 1e-4  # training moved the policy
    # the export's tokenizer is the checkpoint's: same ids in transformers
    theirs = transformers.AutoTokenizer.from_pretrained(merged)
    assert theirs.encode("What is 3 + 4?", add_special_tokens=False) == tokenizer.encode(
        "What is 3 + 4?"
    )
    # ...and its chat template is the checkpoint's, rendering the prompt FAR trained on
    assert (merged / "chat_template.jinja").read_text() == LLAMA32_TEMPLATE

    far_ids = [
        tokenizer.bos_id(),
        *tokenizer.encode(chat_prompt("What is 3 + 4?", TOKENIZER, tokenizer)),
    ]
    their_ids = theirs.apply_chat_template(
        [{"role": "user", "content": _instructed("What is 3 + 4?")}],
        add_generation_prompt=True,
        date_string="26 Jul 2024",
    )
    assert list(their_ids["input_ids"] if hasattr(their_ids, "keys") else their_ids) == far_ids
