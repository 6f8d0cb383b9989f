"""What other tools read from a `far export` of the tiny Gemma 3 (the smoke recipe's model,
with LoRA adapters given random weights): transformers loads it without a warning, decodes as
FAR evaluates (greedy, stopping at <end_of_turn>), renders FAR's prompt from chat messages, and
peft loads the adapter export onto the base's export with the merged export's logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from schemas.recipe import LoraSpec, MeshSpec, ModelSpec
from stages.core.errors import InputError
from stages.data_prep.build import INSTRUCTION, chat_prompt
from stages.modeling import models
from stages.modeling.hf_export import ExportOptions, export_model
from stages.modeling.tokenizers import ByteTokenizer
from tests.conftest import smoke_data
from tests.load_checks import load_warnings

pytestmark = pytest.mark.slow  # the exports fixture builds, exports and loads: ~35 CPU-s

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PROMPTS = [[2, 17, 300, 45, 45, 9, 511, 3, 88, 120, 7], [2, 3, 90, 91, 4, 5, 60, 61, 8]]
# f32 on both sides; peft adds B(A(x)) at run time where the merge added B @ A to the weight
# once: the orders of summation differ, nothing else
ATOL = 1e-5


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(merged export, adapter export) of one LoRA policy on the smoke model."""
    data = smoke_data()["model"]
    # six layers, as Gemma 3 interleaves them: five sliding-window, one global. With none
    # global (the smoke model's two layers) transformers' Gemma3TextConfig adds a global rope
    # entry itself and then warns that the layer types lack it: a transformers quirk that no
    # config.json avoids, and no real Gemma 3 has.
    data["architecture"]["num_layers"] = 6
    spec = ModelSpec.model_validate(data)
    mesh = models.build_mesh(MeshSpec())
    base = models.build_base_model(spec, mesh, "unused-for-random")
    lora = LoraSpec(rank=4, alpha=8.0)
    policy = models.apply_lora(base, lora, mesh)
    # fresh adapters have lora_b == 0; give every adapter weights so there is work to do
    leaves, tree = jax.tree.flatten(nnx.state(policy, nnx.LoRAParam))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [
        0.05 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    nnx.update(policy, jax.tree.unflatten(tree, noisy))
    root = tmp_path_factory.mktemp("export")
    merged, adapter = root / "merged", root / "adapter"
    export_model(spec, base, policy, lora, str(root), str(merged), ExportOptions(card="# card\n"))
    export_model(spec, base, policy, lora, str(root), str(adapter), ExportOptions(adapter=True))
    with pytest.raises(InputError, match="--adapter: the checkpoint holds full weights"):
        export_model(
            spec, base, base, None, str(root), str(root / "x"), ExportOptions(adapter=True)
        )
    return merged, adapter


def logits(model: Any) -> list[np.ndarray]:
    with torch.no_grad():
        return [model(torch.tensor([ids])).logits[0].numpy() for ids in PROMPTS]


def load(directory: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)


def test_merged_export_loads_quietly_and_decodes_as_far(exports) -> None:
    merged, _ = exports
    with load_warnings() as caught:
        model = load(merged)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(merged))
    assert caught == []
    config = json.loads((merged / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert config["transformers_version"] == transformers.__version__  # the lock's pin
    # FAR's decoding: greedy, and the end of the model's turn ends generation
    generation = model.generation_config
    assert generation.eos_token_id == [1, ByteTokenizer().end_of_turn_id()]
    assert (generation.do_sample, generation.pad_token_id, generation.max_new_tokens) == (
        False,
        0,
        32,
    )
    # the tokenizer is FAR's ByteTokenizer: same ids, text round-trips, markers kept
    far = ByteTokenizer()
    for text in [
        "Hi é 😀 <reasoning>r</reasoning><answer>7</answer><end_of_turn>",
        chat_prompt("2+2?"),
    ]:
        ids = tokenizer(text)["input_ids"]
        assert ids == [far.bos_id(), *far.encode(text)]
        assert tokenizer.decode(ids, skip_special_tokens=True).endswith("<answer>7</answer>") or (
            tokenizer.decode(ids[1:]) == text
        )
    # the chat template renders FAR's training prompt from messages
    messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": "2+2?"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert rendered["input_ids"] == [far.bos_id(), *far.encode(chat_prompt("2+2?"))]
    assert (merged / "README.md").read_text() == "# card\n"


def test_adapter_export_on_the_base_export_equals_the_merged_logits(exports) -> None:
    peft = pytest.importorskip("peft")
    merged, adapter = exports
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert config["target_modules"] == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert not (adapter / "model.safetensors").exists()  # the adapter alone, the base beside it
    with load_warnings() as caught:
        base = load(adapter / "base")
        base_logits = logits(base)
        model = peft.PeftModel.from_pretrained(base, str(adapter))
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(adapter))
    assert caught == []
    assert tokenizer("<end_of_turn>", add_special_tokens=False)["input_ids"] == [4]
    ours, theirs = logits(model), logits(load(merged))
    gap = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
    print(f"peft adapter vs merged export: max |logit difference| = {gap:.3g}")
    assert gap < ATOL
    # ...and the adapter matters: the base alone is far from the merged export
    assert (
        max(float(np.abs(a - b).max()) for a, b in zip(base_logits, theirs, strict=True))
        > 100 * ATOL
    )
