"""`far export CHECKPOINT OUT_DIR`: a checkpoint its records vouch for, as a Hugging Face
model directory (merged weights or a peft adapter), written whole or not at all.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from flows.commands.options import (
    EXIT_PROBLEMS,
    add_common_options,
    add_root_options,
    expected_root,
)
from pipeline import lineage
from schemas.artifacts import DatasetArtifact
from stages.core.errors import InputError
from stages.core.records import find_checkpoint_record, record_run
from stages.core.runner import RunContext


def add_command(commands: Any) -> None:
    """Register `far export`."""
    export = commands.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face model directory",
        description=(
            "Merge a LoRA checkpoint into its base weights (or convert a full-weight one) and\n"
            "write a Hugging Face directory that transformers' AutoModelForCausalLM loads:\n"
            "model.safetensors, config.json, the tokenizer with FAR's chat template,\n"
            "generation_config.json (greedy, stops at <end_of_turn>) and a model card\n"
            "(README.md: recipe, data, stages, evaluations, ledger root). CHECKPOINT_URI is\n"
            "an sft or grpo output URI as `far run` prints it.\n"
            "First the checkpoint's files are checked against its record, and its record and\n"
            "the upstream ones the card lists against the ledger (and --expect-root): any\n"
            "difference is exit 1, nothing written. OUT_DIR is new, empty or a previous FAR\n"
            "export (far-export.json), which is replaced whole."
        ),
        formatter_class=argparse.RawTextHelpFormatter,
    )
    export.add_argument("checkpoint_uri", help="checkpoint URI (path, file://, gs://)")
    export.add_argument("out_dir", help="output directory (path or gs:// URI)")
    export.add_argument(
        "--cache-dir",
        default=os.environ.get("FAR_CACHE_DIR"),
        help="converted model weights cache (default ~/.cache/far)",
    )
    export.add_argument(
        "--adapter",
        action="store_true",
        help="write a peft LoRA adapter (adapter_config.json, adapter_model.safetensors)\n"
        "instead of merged weights, with the base's own export in OUT_DIR/base unless the\n"
        "base is a hub repository",
    )
    export.add_argument(
        "--push-to",
        metavar="REPO",
        help="also push the export to this hub repository (NAMESPACE/NAME); the token\n"
        "comes from HF_TOKEN or `hf auth login`",
    )
    export.add_argument(
        "--hub-endpoint",
        metavar="URL",
        default=os.environ.get("HF_ENDPOINT"),
        help="the hub to push to (default HF_ENDPOINT, else huggingface.co)",
    )
    add_root_options(export)
    add_common_options(export)


def cmd_export(args: argparse.Namespace) -> int:
    from stages.modeling import export_card, export_target, hub_push  # no JAX

    export_target.check(args.out_dir)  # before the seconds importing JAX and Tunix
    expect_root = expected_root(args)
    record_uri, record = find_checkpoint_record(args.checkpoint_uri)
    if args.adapter and getattr(record.output, "lora", None) is None:
        raise InputError(
            f"--adapter: checkpoint {args.checkpoint_uri} holds full weights, not LoRA "
            "adapters; export it without --adapter"
        )
    vouched = [uri for uri, _ in reversed(export_card.upstream(record_uri, record))]
    problems = lineage.export_problems(vouched, args.audit_key, expect_root, args.accept_later)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(
            f"far: export refused, nothing written: {problems[0]}{more}; "
            f"`far audit {record_run(record_uri)}` lists every problem",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    facts = export_card.gather(args.checkpoint_uri)
    then = None
    if args.push_to:
        api = hub_push.hub_api(args.push_to, args.hub_endpoint)
        message = f"far export {facts.stage} step {facts.step}"
        then = lambda local: hub_push.push(api, args.push_to, local, message)  # noqa: E731
    from stages.modeling.hf_export import ExportOptions, export_checkpoint  # imports JAX, Tunix

    datasets = [r.output for _, r in facts.stages if isinstance(r.output, DatasetArtifact)]
    options = ExportOptions(
        template=datasets[0].prompt.template if datasets else "gemma",
        adapter=args.adapter,
        card=export_card.model_card(facts, args.adapter),
        max_new_tokens=export_card.eval_max_new_tokens(facts),
        then=then,
    )
    cache_dir = RunContext(root="", run="", cache_dir=args.cache_dir).model_cache
    out = export_checkpoint(args.checkpoint_uri, args.out_dir, cache_dir, options)
    print(f"exported {args.checkpoint_uri} -> {out}")
    if args.push_to:
        print(f"pushed to {args.push_to} at {api.endpoint}")
    return 0
