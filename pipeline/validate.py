"""Everything about a run that can be checked before any compute, checked at once.

`far run`, `far validate` and the scheduled deployment call `validate_run` after the recipe
parsed and before the flow starts, so a wrong reward name (in the `grpo` or `eval` section,
any `grpo` or `evaluate` node), a `self_teach` node verifying with an unknown reward, a
`preferences` node given both a file and samples, a mesh larger than the machine, an
unreachable model or MLflow tracking server (or an MLflow path that cannot be written), a
missing data file (of any node) or evaluation checkpoint, or a storage root that cannot be
written is refused in seconds with one line naming the node, field or file, instead of
after the stages before it spent their compute. Each check raises
stages.core.errors.InputError.
"""

from __future__ import annotations

import logging
import math
import uuid

from pipeline.dag import Dag, build_dag, node_config
from schemas.recipe import (
    EVAL_MODELS,
    DataPrepConfig,
    EvalConfig,
    GRPOConfig,
    HardSubsetConfig,
    MeshSpec,
    ModelSpec,
    PreferencesConfig,
    Recipe,
    SelfTeachConfig,
    StageNode,
)
from stages import registry
from stages.core import metrics_logging, storage
from stages.core.errors import InputError, MissingInput
from stages.core.records import find_checkpoint_record
from stages.core.sessions import STARTUP_AND_STEP_SECONDS
from stages.data_prep.adapters import Example
from stages.data_prep.sources import check_file_columns, check_reasoning

log = logging.getLogger(__name__)
GREEDY_SUFFIX = "@greedy"  # an evaluation's greedy row beside a sampled one (EvalConfig.greedy)


def validate_run(recipe: Recipe, root: str, cache_dir: str, computes: bool = True) -> None:
    """Every check below, cheapest first; the first failure raises InputError. A session that
    `computes` nothing (every stage complete: pipeline.plan.completed_nodes) needs no devices and no
    model, so their checks are left out."""
    check_nodes(recipe)
    for warning in ignored_eval_models(recipe):
        log.warning("%s", warning)
    check_storage_writable(root)
    if computes:
        metrics_logging.check_tracking_uri(recipe.logging)
        check_mesh(recipe.mesh)
        check_model(recipe.model, cache_dir)
        check_prompt_templates(recipe, cache_dir)
        check_sft_targets(recipe, cache_dir)


def ignored_eval_models(recipe: Recipe) -> list[str]:
    """One warning per evaluate node of a `pipeline:` that does not score the recipe's
    `eval.models` when the recipe changed them from the default: such a node scores 'base'
    and its checkpoint inputs (or its own config.models), so the models listed there would go
    unscored without a word. `far validate` prints them; `far run` logs them."""
    wanted = list(recipe.eval.models)
    if recipe.pipeline is None or set(wanted) == set(EvalConfig().models):
        return []
    warnings = []
    for node in build_dag(recipe).nodes:
        config = node_config(recipe, node)
        if isinstance(config, EvalConfig) and set(config.models) != set(wanted):
            warnings.append(
                f"pipeline node {node.id!r} (evaluate) scores {list(config.models)}, not "
                f"eval.models {wanted}: a pipeline's evaluate node scores 'base' and its "
                f"checkpoint inputs, or its own config.models; list the models there"
            )
    return warnings


def check_session_budget(recipe: Recipe) -> None:
    """A session budget must cover start-up, one step and the largest save margin of the DAG's
    training nodes; a smaller one stops every session at step 0, for ever (`far run` and
    `far validate`; a deployment's budget is its schedule's business)."""
    budget = recipe.session_budget
    margins = [
        (node.id, float(margin))
        for node in build_dag(recipe).nodes
        if (margin := getattr(node_config(recipe, node), "save_margin_seconds", None)) is not None
    ]
    if budget is None or not margins:
        return
    node, margin = max(margins, key=lambda pair: pair[1])
    smallest = math.ceil(margin + STARTUP_AND_STEP_SECONDS)
    if budget.total_seconds() < smallest:
        raise InputError(
            f"session_budget: {budget.total_seconds():g} s cannot make progress: node {node!r} "
            f"keeps {margin:g} s free for its save (save_margin_seconds) and start-up plus one "
            f"step need about {STARTUP_AND_STEP_SECONDS:g} s more; the smallest budget that "
            f"works is {smallest}s (--session-budget {smallest}s, or a smaller save margin)"
        )


def check_nodes(recipe: Recipe) -> None:
    """Each node of the recipe's DAG (the default one too) with the config it will run with."""
    explicit = recipe.pipeline is not None
    dag = build_dag(recipe)
    for node in dag.nodes:
        config = node_config(recipe, node)
        where = f"pipeline node {node.id!r} ({node.kind}): config." if explicit else ""
        if isinstance(config, GRPOConfig):
            check_rewards(config, f"{where}rewards" if explicit else "grpo.rewards")
        elif isinstance(config, SelfTeachConfig):
            check_reward_names(config.verify, f"{where}verify")
        elif isinstance(config, PreferencesConfig):
            check_preferences(node, config, f"{where}file")
        elif isinstance(config, DataPrepConfig):
            check_data_files(config, f"{where}" if explicit else "data.")
        elif isinstance(config, EvalConfig):
            check_eval_checkpoints(config, f"{where}models" if explicit else "eval.models")
            check_reward_names(config.rewards, f"{where}rewards" if explicit else "eval.rewards")
        elif isinstance(config, HardSubsetConfig):
            check_hard_subset(recipe, dag, node, config)


def check_hard_subset(recipe: Recipe, dag: Dag, node: StageNode, config: HardSubsetConfig) -> None:
    """What a hard_subset node selects can be checked against the evaluation it reads and the
    dataset it keeps from before either runs: the model label, the outcome `by`, a band a
    greedy evaluation can never fill, min_prompts against the split, and the samples a band
    needs for the GRPO nodes trained on it."""
    where = f"pipeline node {node.id!r} (hard_subset): config."
    evaluation = dag.node(node.inputs["evaluation"])
    scored = node_config(recipe, evaluation)
    labels = evaluated_labels(scored)
    if config.model not in labels:
        raise InputError(
            f"{where}model: {config.model!r} is not a model {evaluation.id} evaluates; its "
            f"labels: {labels}"
        )
    reward = config.by.removeprefix("reward/")
    if config.by.startswith("reward/") and reward not in scored.rewards:
        raise InputError(
            f"{where}by: {evaluation.id} does not score reward {reward!r} (its config.rewards: "
            f"{scored.rewards}); add it there, or select by correct or format"
        )
    samples = 1 if config.model.endswith(GREEDY_SUFFIX) else scored.samples
    if config.above is not None and samples == 1 and not config.by.startswith("reward/"):
        raise InputError(
            f"{where}above: {evaluation.id} decodes {config.model} once per prompt, so every "
            f"solve rate is 0 or 1 and the band ({config.above}, {config.below}) is always "
            f"empty; give {evaluation.id} samples >= 2 and a temperature, or drop above"
        )
    _check_hard_min_prompts(recipe, dag.node(node.inputs["dataset"]), config, where)
    for reader in dag.nodes:
        trains = node_config(recipe, reader) if reader.inputs.get("dataset") == node.id else None
        group = trains.num_generations if isinstance(trains, GRPOConfig) else 0
        if config.above is not None and 1 < samples < group:
            raise InputError(
                f"{where}above: {evaluation.id} samples {samples} completions per prompt, fewer "
                f"than the group of {group} that {reader.id} samples, so the band misjudges "
                f"which prompts give GRPO a gradient; set {evaluation.id}'s samples >= {group}"
            )


def evaluated_labels(config: EvalConfig) -> list[str]:
    """The model labels an evaluation's samples carry (stages/evaluate/evaluation.py's
    _variant_labels): each model, base's k-shot row, and with greedy a greedy row each."""
    labels = list(config.models)
    if "base" in labels and config.base_shots:
        labels.append(f"base-{config.base_shots}shot")
    if config.greedy:
        labels += [label + GREEDY_SUFFIX for label in labels]
    return labels


def _check_hard_min_prompts(
    recipe: Recipe, source: StageNode, config: HardSubsetConfig, where: str
) -> None:
    data = node_config(recipe, source)
    if isinstance(data, DataPrepConfig) and config.min_prompts > data.grpo.size:
        raise InputError(
            f"{where}min_prompts: {config.min_prompts} is more than the {data.grpo.size} "
            f"prompts of {source.id}'s grpo_train split (data grpo.size); lower min_prompts "
            f"or raise the split's size"
        )


def check_rewards(config: GRPOConfig, field: str = "grpo.rewards") -> None:
    check_reward_names(list(config.rewards), field)


def check_reward_names(names: list[str], field: str) -> None:
    """Each name is a registered reward (FAR's own, or a plugin's imported by --plugin or the
    recipe's plugins); UnknownReward names the field, the registered ones and a close one."""
    from stages.rewards import UnknownReward, get_reward

    for name in names:
        try:
            get_reward(name)
        except UnknownReward as e:
            raise UnknownReward(f"{field}: {e}") from e


def check_preferences(node: StageNode, config: PreferencesConfig, field: str) -> None:
    """Pairs come from a file or from a samples input, never both, never neither."""
    samples = node.inputs.get("samples")
    if config.file is not None and samples is not None:
        raise InputError(
            f"{field}: {config.file!r} and input samples <- {samples!r} both give pairs; "
            f"keep one (remove config.file, or the samples input)"
        )
    if config.file is None and samples is None:
        raise InputError(
            f"{field}: node {node.id!r} has no pairs to read; set config.file to a json/jsonl "
            f"file of pairs, or give it a samples input (an evaluate or grpo node)"
        )
    if config.file is not None:
        check_is_file(config.file, field, "preference pairs file")


def check_is_file(uri: str, field: str, what: str) -> None:
    """`uri` exists and is a file, not a directory."""
    if not storage.exists(uri):
        raise MissingInput(f"{field}: {what} not found: {uri}")
    if storage.is_dir(uri):
        raise InputError(f"{field}: {uri} is a directory; expected a {what}")


def check_storage_writable(root: str) -> None:
    """Write and delete a probe object under `root` (a local dir, gs:// bucket, memory://).

    A local root that does not exist yet is probed in its nearest existing ancestor, where
    the run would create it: validation leaves no directory behind (`far validate` writes
    nothing)."""
    where = storage.nearest_existing(root)
    probe = storage.join(where, f".far-write-probe-{uuid.uuid4().hex[:12]}")
    try:
        storage.write_bytes(probe, b"")
        storage.delete(probe)
    except OSError as e:
        raise InputError(
            f"storage_root {root} is not writable ({type(e).__name__}: {e}); expected a "
            f"directory or bucket this user can write"
        ) from e


def check_data_files(config: DataPrepConfig, prefix: str = "data.") -> None:
    """Each file source exists and its first row has the columns its map or preset reads; a
    source with `reasoning: steps` has rows a chain can be worked from. A source several
    splits read is checked once, where it first appears."""
    checked: set[str] = set()
    for split in ("eval", "validation", "grpo", "sft"):  # DataPrepConfig's split sections
        section = getattr(config, split)
        for index, source in enumerate(section.sources if section is not None else []):
            field = f"{prefix}{split}.sources[{index}]"
            if source.model_dump_json() in checked:
                continue
            checked.add(source.model_dump_json())
            if source.kind == "file":
                check_is_file(source.name, f"{field}.name", "data source file")
                try:
                    check_file_columns(source)
                except InputError as e:
                    raise type(e)(f"{field}: {e}") from e
            try:
                check_reasoning(source)
            except InputError as e:
                raise type(e)(f"{field}.reasoning: {e}") from e


def check_eval_checkpoints(config: EvalConfig, field: str = "eval.models") -> None:
    for index, name in enumerate(config.models):
        if name in EVAL_MODELS or "/" not in name:
            continue  # this run's stages (and, in a pipeline, the node's inputs)
        try:
            find_checkpoint_record(name)
        except FileNotFoundError as e:
            raise MissingInput(f"{field}[{index}]: {e}") from e


def check_mesh(spec: MeshSpec) -> None:
    """A mesh of one device fits every machine JAX runs on: only a larger one imports JAX
    (seconds) to count the devices."""
    if spec.fsdp * spec.tp == 1:
        return
    import jax  # deferred: the rest of validation needs no accelerator runtime

    needed, present = spec.fsdp * spec.tp, jax.device_count()
    if needed > present:
        raise InputError(
            f"mesh: fsdp={spec.fsdp} x tp={spec.tp} needs {needed} devices, this machine has "
            f"{present} ({jax.devices()[0].platform}); expected fsdp x tp <= {present}"
        )


def check_model(spec: ModelSpec, cache_dir: str) -> None:
    """The model's weights and tokenizer are reachable (downloaded or converted once, cached)."""
    from stages.modeling.tokenizers import build_tokenizer

    try:
        build_tokenizer(spec, cache_dir)
    except ImportError as e:
        raise InputError(f"model.source {spec.source!r}: {e}") from e


def check_prompt_templates(recipe: Recipe, cache_dir: str) -> None:
    """A data_prep whose prompt format takes the tokenizer's chat template needs a tokenizer
    that ships one (the byte tokenizer of the smoke recipes does not)."""
    from stages.modeling.tokenizers import build_tokenizer, has_chat_template, no_chat_template

    explicit = recipe.pipeline is not None
    for node in build_dag(recipe).nodes:
        config = node_config(recipe, node)
        if isinstance(config, DataPrepConfig) and config.prompt.template == "tokenizer":
            tokenizer = build_tokenizer(recipe.model, cache_dir)
            if not has_chat_template(tokenizer):
                where = f"pipeline node {node.id!r} (data_prep): config." if explicit else "data."
                raise no_chat_template(tokenizer, f"{where}prompt.template")


def check_sft_targets(recipe: Recipe, cache_dir: str) -> None:
    """SFT targets against the smallest generation budget of the DAG (`max_generation_tokens`
    of its grpo, evaluate and self_teach nodes): a model trained to write a longer target is
    cut off before its answer closes and scores format 0 with no other sign. A recipe whose
    longest target does not fit is refused with the token counts, unless it sets
    `allow_long_sft_targets` (then one warning line names the longest); when no target fits
    it is refused either way. One read of each data_prep node's sft sources: the rows
    data_prep writes (in the prompt format it settles on, so answer-only rows count as their
    answer), tokenized as SFT trains on them; rows over max_seq_len are left out (data_prep
    quarantines them). Hub sources are left to the run (reading them needs the network)."""
    explicit = recipe.pipeline is not None
    budgets = []
    for node in build_dag(recipe).nodes:
        tokens = getattr(node_config(recipe, node), "max_generation_tokens", None)
        if isinstance(tokens, int):
            section = registry.spec(node.kind).section or node.kind
            where = f"pipeline node {node.id!r}: config." if explicit else f"{section}."
            budgets.append((tokens, f"{where}max_generation_tokens"))
    if not budgets:
        return
    limit, field = min(budgets)
    for node in build_dag(recipe).nodes:
        config = node_config(recipe, node)
        if isinstance(config, DataPrepConfig):
            targets = sft_target_lengths(config, recipe.model, cache_dir)
            _check_targets(targets, limit, field, recipe.allow_long_sft_targets)


def _check_targets(
    targets: list[tuple[int, Example]], limit: int, field: str, allowed: bool
) -> None:
    over = [(tokens, example) for tokens, example in targets if tokens > limit]
    if not over:
        return
    every = len(over) == len(targets)
    tokens, example = (min if every else max)(over, key=lambda t: t[0])
    said = (
        f"{field}: {limit} tokens; {len(over)} of {len(targets)} SFT targets are longer (the "
        f"{'shortest' if every else 'longest'}: {tokens} tokens, row "
        f"{example.id}, {example.prompt[:40]!r})"
    )
    if allowed and not every:
        log.warning(
            "%s; a model trained on them is cut off before their answers close "
            "(allow_long_sft_targets: true)",
            said,
        )
        return
    accept = "" if every else ", or allow_long_sft_targets: true to train on them anyway"
    raise InputError(
        f"{said}: a model trained on them is cut off before its answer closes and scores "
        f"format 0. Expected max_generation_tokens >= {tokens}, or shorter targets (shorter "
        f"reasoning, no filler, or answer_format: answer){accept}"
    )


def sft_target_lengths(
    config: DataPrepConfig, model: ModelSpec, cache_dir: str
) -> list[tuple[int, Example]]:
    """(tokens, row) of each SFT target (its end-of-turn included, EOS not) among the rows of
    the local sft sources that fit max_seq_len."""
    from stages.data_prep import build
    from stages.modeling.tokenizers import build_tokenizer

    distinct = {s.model_dump_json(): s for s in config.sft.sources}
    local = [s for s in distinct.values() if s.kind != "hf"]
    if not local:
        return []
    quarantine, dedupe = build.Quarantine(), build.Deduper()
    examples = [e for s in local for e in build.load_source(s, config.seed, quarantine, dedupe)]
    prompt = build.resolved_prompt(config.prompt, examples)
    tokenizer = build_tokenizer(model, cache_dir)
    lengths = []
    for example in examples:
        tokens, mask = build.sft_sequence(example, tokenizer, prompt)
        if len(tokens) <= config.max_seq_len:
            lengths.append((sum(mask) - 1, example))
    return lengths
