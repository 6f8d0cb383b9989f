"""A user's reward in either form FAR calls (per completion, or TRL's batch form with None as
"not applicable"), seeing its row's columns; what is refused (a third signature, a bad value
naming the completion, an overflowing weight, sum or advantage); and a reward that blocks or
exits stopping its stage instead of hanging it or ending `far` with exit 0.

The plugins are real module files imported by the real `far` main; GRPO's sums go through the
real Tunix reward manager FAR registers (stages/grpo/reward_sums.py) with a real Tunix config.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from tunix.rl import function_registry

from schemas.recipe import GRPOConfig
from stages import rewards, self_teach
from stages.core.runner import RunContext, SessionExpired
from stages.core.sessions import StopFlag
from stages.data_prep.adapters import Example
from stages.evaluate import evaluation
from stages.grpo import reward_sums
from stages.grpo import training as grpo
from stages.rewards import guard
from tests.unit.test_plugin_rewards import _far, _forget_plugins, _module, _one_line, _recipe

__all__ = ["_forget_plugins"]  # the autouse fixture: each test starts with FAR's rewards only

TRL = (
    "from stages.rewards import reward\n"
    "@reward('far_user_trl')\n"
    "def trl(prompts, completions, answer, unit, **kwargs):\n"
    "    '''1 when the completion names the answer in the row's unit; None for no unit.'''\n"
    "    return [None if u is None else float(f'{a} {u}' in c)\n"
    "            for c, a, u in zip(completions, answer, unit)]\n"
)


@pytest.fixture
def trl_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from pipeline import plugins

    name = _module(tmp_path, monkeypatch, "far_user_trl", TRL)
    plugins.load_plugin(name)
    yield "far_user_trl"


def _refs(*units: str | None) -> list[rewards.Reference]:
    return [
        rewards.Reference("4", prompt=f"p{i}", columns={"unit": u}) for i, u in enumerate(units)
    ]


def test_the_two_forms_are_told_by_signature() -> None:
    def per(completion: str, ref: rewards.Reference) -> float:
        return 1.0

    def batch(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [1.0] * len(completions)

    def trl_short(completions: list[str], **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    assert guard.form_of("a", per) == "completion"
    assert guard.form_of("a", lambda c, r: 1.0) == "completion"
    assert guard.form_of("a", batch) == "batch"
    assert guard.form_of("a", trl_short) == "batch"  # TRL calls with keywords: fits too
    for wrong in (lambda: 1.0, lambda c: 1.0, lambda a, b, c: 1.0):
        with pytest.raises(rewards.BadRewardSignature) as e:
            rewards.register_reward("far_user_wrong", wrong)
        assert "fits neither form" in str(e.value)
        assert "f(completion, ref) -> float" in str(e.value)
        assert "f(prompts, completions, **columns) -> list[float | None]" in str(e.value)
    assert "far_user_wrong" not in rewards.REGISTRY


def test_far_validate_refuses_a_reward_of_neither_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (
        "from stages.rewards import reward\n@reward('concise_correct')\ndef f(a, b, c): return 1\n"
    )
    name = _module(tmp_path, monkeypatch, "far_user_three", source)
    line = _one_line(*_far(capsys, "validate", _recipe(tmp_path), "--plugin", name)[::2])
    assert "reward 'concise_correct' (far_user_three): f(a, b, c) fits neither form" in line
    assert "f(prompts, completions, **columns)" in line and "f(completion, ref)" in line


def test_a_batch_reward_sees_prompts_and_columns_and_may_say_none(trl_reward: str) -> None:
    got = rewards.get_reward(trl_reward).score(
        ["4 km", "5 km", "4 kg"], _refs("km", "km", None), rewards.SandboxStats()
    )
    assert got == [1.0, 0.0, None]
    seen: dict[str, Any] = {}

    def spy(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        seen.update(prompts=prompts, **columns)
        return [0.0] * len(completions)

    spy.__module__ = "far_user_trl"  # a user's: guarded and called with keywords
    rewards.register_reward("far_user_spy", spy)
    refs = [rewards.Reference("4", ("assert f() == 4",), prompt="p", columns={"unit": "km"})]
    rewards.get_reward("far_user_spy").score(["c"], refs, rewards.SandboxStats())
    assert seen == {
        "prompts": ["p"],
        "unit": ["km"],
        "answer": ["4"],
        "tests": [["assert f() == 4"]],
    }


def test_none_is_left_out_of_the_evaluation_mean_and_of_self_teach(trl_reward: str) -> None:
    rows = [
        {"id": "a", "prompt": "p", "answer": "4", "columns": {"unit": "km"}},
        {"id": "b", "prompt": "q", "answer": "4", "columns": {}},
    ]
    scored = evaluation.extra_rewards(rows, ["4 km", "4 km"], [trl_reward], rewards.SandboxStats())
    assert scored == {"reward/far_user_trl": [1.0, None]}
    assert evaluation.applicable_means(scored) == {"reward/far_user_trl": 1.0}  # not 0.5
    assert evaluation.applicable_means({"reward/x": [None, None]}) == {}
    from schemas.recipe import SelfTeachConfig

    config = SelfTeachConfig(verify=[trl_reward], samples=1)
    samples = self_teach.verified(rows, ["4 km", "4 km"], config)
    assert [s["rewards"] for s in samples] == [{trl_reward: 1.0}, {}]
    assert [s["verified"] for s in samples] == [True, False]  # nothing applied: not verified


@pytest.mark.parametrize(
    ("returned", "says"),
    [
        ("[float('nan')] * len(completions)", "scored nan for completion 0 'first one"),
        ("['high'] * len(completions)", "scored 'high' for completion 0"),
        ("[1.0]", "returned list of 1 for 2 completions"),
        ("None", "returned NoneType for 2 completions"),
    ],
)
def test_a_bad_batch_value_names_the_reward_and_the_completion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, returned: str, says: str
) -> None:
    from pipeline import plugins

    source = (
        "from stages.rewards import reward\n@reward('far_user_bad')\n"
        f"def f(prompts, completions, **kw): return {returned}\n"
    )
    plugins.load_plugin(_module(tmp_path, monkeypatch, "far_user_bad", source))
    long = "first one " + "x" * 400
    with pytest.raises(rewards.RewardFailed, match=r"reward 'far_user_bad' \(far_user_bad\)") as e:
        rewards.get_reward("far_user_bad").score(
            [long, "b"], _refs(None, None), rewards.SandboxStats()
        )
    assert says in str(e.value)
    if "completion 0" in says:  # the first 200 characters, not the whole completion
        assert repr(long[:200]) + "..." in str(e.value) and long not in str(e.value)


def test_reward_weights_are_bounded() -> None:
    for weight in (1e308, -2e6, math.inf):
        with pytest.raises(ValidationError, match=r"within \[-1e\+06, 1e\+06\]"):
            GRPOConfig(max_steps=1, batch_size=1, rewards={"answer_match": weight})
    GRPOConfig(max_steps=1, batch_size=1, rewards={"answer_match": 1e6, "format_strict": -1e6})


def _manager(fns: list[Any], generations: int = 2) -> Any:
    config = grpo.algorithm_config(
        GRPOConfig(max_steps=1, batch_size=1, num_generations=generations)
    )
    assert config.reward_manager == reward_sums.NAME
    return function_registry.get_reward_manager(config.reward_manager)(fns, config)


def _batch(completions: list[str], units: list[str | None]) -> dict[str, Any]:
    return {
        "prompts": [f"p{i // 2}" for i in range(len(completions))],
        "completions": completions,
        "answer": np.asarray(["4"] * len(completions)),
        "columns": np.asarray([json.dumps({"unit": u}) for u in units]),
    }


def test_grpo_sums_leave_none_out_and_groups_without_reward_are_flat(trl_reward: str) -> None:
    fns = rewards.tunix_reward_fns({trl_reward: 2.0})
    # prompt 0: both completions applicable; prompt 1: neither (no unit on its rows)
    info = _manager(fns)(**_batch(["4 km", "5 km", "4 kg", "x"], ["km", "km", None, None]))
    assert info["rewards"].tolist() == [2.0, 0.0, 0.0, 0.0]
    logged = info["log_metrics"]
    assert logged[reward_sums.WITHOUT_REWARD][0] == 0.5
    values, aggregate = logged[f"rewards/{trl_reward}"]
    assert values.tolist() == [2.0, 0.0] and aggregate is np.mean  # mean 1.0, not 0.5
    assert all(np.isfinite(logged[f"rewards/{k}"][0]).all() for k in ("sum", "min", "max"))
    with_format = rewards.tunix_reward_fns({trl_reward: 1.0, "format_strict": 1.0})
    info = _manager(with_format)(**_batch(["a", "b", "c", "d"], [None] * 4))
    assert info["log_metrics"][reward_sums.WITHOUT_REWARD][0] == 0.0  # format applies
    assert f"rewards/{trl_reward}" not in info["log_metrics"]  # applied to none this step


def test_grpo_advantage_of_a_prompt_without_reward_is_zero(trl_reward: str) -> None:
    """Under the greedy baseline too: the group's sums are set flat, baseline term included."""

    def baseline(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [-1.0] * len(completions)  # -R(greedy): the greedy completion earned 1

    fns = [*rewards.tunix_reward_fns({trl_reward: 1.0}), baseline]
    info = _manager(fns)(**_batch(["4 km", "5 km", "a", "b"], ["km", "km", None, None]))
    assert info["rewards"].tolist() == [0.0, -1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("value", "weights", "says"),
    [
        ("1e308", (10.0, 0.0), "scored 1e+308 for completion 0 'a', inf at weight 10"),
        ("1e308", (1.0, 1.0), "sum to inf"),
        ("1.5e308", (1.0,), "have the advantage nan"),
    ],
)
def test_an_overflowing_reward_stops_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    weights: tuple[float, ...],
    says: str,
) -> None:
    """1e308 times a weight overflows; two terms of 1e308 sum to inf; one of 1.5e308 sums fine
    but GRPO's group mean overflows: each is a RewardFailed naming the reward, before an update."""
    from pipeline import plugins

    source = (
        "from stages.rewards import reward\n@reward('far_user_huge')\n"
        f"def f(completion, ref): return {value}\n"
        "@reward('far_user_huge_too')\n"
        f"def g(completion, ref): return {value}\n"
    )
    plugins.load_plugin(_module(tmp_path, monkeypatch, "far_user_huge", source))
    names = ("far_user_huge", "far_user_huge_too")
    fns = rewards.tunix_reward_fns(dict(zip(names, weights, strict=False)))
    with pytest.raises(rewards.RewardFailed, match="far_user_huge") as e:
        _manager(fns)(**_batch(["a", "b", "c", "d"], [None] * 4))
    assert says in str(e.value)


def _sleeper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> rewards.Reward:
    from pipeline import plugins

    source = (
        "import time\nfrom stages.rewards import reward\n@reward('far_user_slow')\n"
        "def f(completion, ref):\n    time.sleep(600)\n    return 1.0\n"
    )
    plugins.load_plugin(_module(tmp_path, monkeypatch, "far_user_slow", source))
    return rewards.get_reward("far_user_slow")


def test_a_blocking_reward_stops_at_its_call_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = _sleeper(tmp_path, monkeypatch)
    stats = rewards.SandboxStats(limit=guard.CallLimit(seconds=0.5))
    started = time.monotonic()
    with pytest.raises(
        rewards.RewardFailed, match=r"'far_user_slow' .* did not return within 0.5 s"
    ):
        slow.score(["a"], _refs(None), stats)
    assert time.monotonic() - started < 5


def test_a_blocking_reward_ends_at_the_deadline_and_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = _sleeper(tmp_path, monkeypatch)
    past = rewards.SandboxStats(limit=guard.CallLimit(deadline=time.time() + 0.3))
    with pytest.raises(SessionExpired, match=r"deadline passed while reward 'far_user_slow'"):
        slow.score(["a"], _refs(None), past)
    stop = StopFlag()
    stop.request("received signal SIGTERM")
    monkeypatch.setattr("stages.rewards.guard.STOP_GRACE_SECONDS", 0.3)
    stopped = rewards.SandboxStats(limit=guard.CallLimit(stop=stop))
    with pytest.raises(SessionExpired, match=r"SIGTERM while reward 'far_user_slow'"):
        slow.score(["a"], _refs(None), stopped)


def test_the_call_limit_comes_from_the_recipe(tmp_path: Path) -> None:
    from pipeline.recipes import RecipeError, load_recipe

    path = Path(_recipe(tmp_path))
    path.write_text(path.read_text() + "sandbox: {isolation: process, reward_call_seconds: 7}\n")
    recipe = load_recipe(str(path))
    assert recipe.sandbox.reward_call_seconds == 7.0
    stop = StopFlag()
    ctx = RunContext(root="r", run="n", deadline=5.0, stop=stop, reward_call_seconds=7.0)
    assert rewards.stats_for(ctx).limit == guard.CallLimit(7.0, 5.0, stop)
    path.write_text(path.read_text().replace("reward_call_seconds: 7", "reward_call_seconds: 0"))
    with pytest.raises(RecipeError, match="reward_call_seconds"):
        load_recipe(str(path))


def test_a_mapped_sources_own_columns_reach_the_prompt_rows(tmp_path: Path) -> None:
    """data_prep keeps a mapped source's columns under its names, for a user's reward; a
    source without a map (the bundled presets) writes the rows it always wrote."""
    from schemas.recipe import SourceSpec
    from stages.data_prep import build

    path = tmp_path / "mine.jsonl"
    rows = [{"question": "2 km and 2 km?", "result": "4", "unit": "km", "meta": {"n": 1}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = SourceSpec(
        kind="file", name=str(path), columns={"prompt": "question", "answer": "result"}
    )
    [example] = build.load_source(spec, 0, build.Quarantine(), build.Deduper())
    row = build.prompt_row(example)
    assert row["columns"] == rows[0] and row["answer"] == "4"
    [ref] = rewards.row_references([row])
    assert ref.columns["unit"] == "km" and ref.prompt == row["prompt"]
    plain = Example(**{f.name: getattr(example, f.name) for f in dataclasses.fields(Example)})
    assert "columns" not in build.prompt_row(plain)  # unmapped: the rows as before


def test_the_pages_batch_reward_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/your-own-task.md shows tests/plugins/trl_reward.py: it registers, and scores."""
    from pipeline import plugins

    plugins.load_plugin("tests.plugins.trl_reward")
    (fn,) = rewards.tunix_reward_fns({"answer_with_unit": 1.0})
    got = fn(**_batch(["4 km", "4", "4 km", "x"], ["km", "km", None, None]))
    assert got[:2] == [1.0, 0.0] and all(math.isnan(v) for v in got[2:])
    page = (Path(__file__).parents[2] / "docs" / "your-own-task.md").read_text()
    assert '--8<-- "tests/plugins/trl_reward.py"' in page
