"""A LoRA checkpoint as a peft adapter (adapter_config.json + adapter_model.safetensors).

peft adds `scaling * lora_B(lora_A(x))` to each target Linear, scaling = alpha / r, with
lora_A.weight (r, in) and lora_B.weight (out, r). qwix's adapters on Tunix's einsums are the
factors Tunix's merge multiplies into (in, out) deltas, `A @ B * alpha / rank`, after flattening
the head axes the way the weight export does (q: (r, N, H) -> (r, N*H); kv_einsum's (r, 2, K,
H) splits into k and v; attn_vec: (N, H, r) -> (N*H, r)). So lora_A.weight = A.T and
lora_B.weight = B.T, under the Hugging Face module names the weight export uses (the family's
`lora_hf_modules`); peft then gives the merged export's logits on the base's export. Qwen 3 and
Llama 3 adapt their q/k/v/o projections ((D, N, H) and (N, H, D) kernels, flattened alike) and
the same MLPs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from schemas.recipe import LoraSpec
from stages.core.errors import InputError

PEFT_PREFIX = "base_model.model.model."


def lora_factors(policy: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Tunix module path ("layers.0.attn.q_einsum") -> its (lora_a, lora_b) arrays."""
    factors: dict[str, dict[str, np.ndarray]] = {}
    for path, value in nnx.iter_graph(policy):
        if isinstance(value, nnx.LoRAParam):
            name = ".".join(str(p) for p in path[:-1])
            which = "a" if "lora_a" in str(path[-1]) else "b"
            factors.setdefault(name, {})[which] = np.asarray(value.get_value(), np.float32)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, pair in factors.items():
        a, b = pair["a"], pair["b"]
        if name.endswith("attn.kv_einsum"):
            out[name.replace("kv_einsum", "k_einsum")] = (a, b[:, 0])
            out[name.replace("kv_einsum", "v_einsum")] = (a, b[:, 1])
        else:
            out[name] = (a, b)
    return out


def _hf_module(name: str, hf_modules: Mapping[str, str]) -> str:
    prefix, _, module = name.partition(".")  # "layers", "0.attn.q_einsum"
    index, _, tunix_module = module.partition(".")
    if prefix != "layers" or tunix_module not in hf_modules:
        raise InputError(
            f"adapter export: LoRA on {name!r} has no Hugging Face module; expected adapters on "
            f"layers.N.{{{', '.join(hf_modules)}}}"
        )
    return f"layers.{index}.{hf_modules[tunix_module]}"


def adapter_tensors(policy: Any, hf_modules: Mapping[str, str]) -> dict[str, np.ndarray]:
    """peft's adapter_model.safetensors tensors for the LoRA adapters in `policy`, named by
    `hf_modules` (the family's lora_hf_modules: Tunix module -> Hugging Face module)."""
    tensors: dict[str, np.ndarray] = {}
    for name, (a, b) in lora_factors(policy).items():
        if "qkv_einsum" in name:
            raise InputError(
                "adapter export: LoRA on a fused-qkv model (num_heads == num_kv_heads) has no "
                "peft layout; Gemma 2 and 3 presets are not fused"
            )
        a2 = a.reshape(-1, a.shape[-1])  # (in, r)
        b2 = b.reshape(b.shape[0], -1)  # (r, out)
        module = PEFT_PREFIX + _hf_module(name, hf_modules)
        tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(a2.T)
        tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(b2.T)
    if not tensors:
        raise InputError("adapter export: the checkpoint holds no LoRA adapters; export it merged")
    return tensors


def adapter_config(
    lora: LoraSpec, target_modules: list[str], base_model: str | None
) -> dict[str, Any]:
    """peft's adapter_config.json for a LoRA adapter of rank `lora.rank`, alpha `lora.alpha`."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": 0.0,
        "target_modules": target_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }


def write_adapter(
    policy: Any,
    lora: LoraSpec,
    base_model: str | None,
    out_dir: str,
    hf_modules: Mapping[str, str],
) -> None:
    """adapter_config.json and adapter_model.safetensors for `policy`'s adapters in `out_dir`."""
    tensors = adapter_tensors(policy, hf_modules)
    targets = sorted({name.split(".")[-3] for name in tensors})
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"))
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(lora, targets, base_model), f, indent=2)
        f.write("\n")
