"""A reward is one function: a user's module registers it the way FAR's own six are, `--plugin`
or the recipe's `plugins:` loads it, `far validate` checks its name before compute, GRPO's and
the evaluation's scoring call it in this (the grader's) process, and the stages that use it
hash its source file, which `far lineage` shows.

The plugins are real module files (tests/plugins/, or written to a temporary directory on
sys.path), imported by the real `far` main in this process; the stage record is committed by
the real runner.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from flows import cli
from pipeline import manifest, plugins
from pipeline.recipes import load_recipe
from schemas.recipe import EvalConfig, GRPOConfig, SelfTeachConfig
from stages import registry, rewards, self_teach
from stages.core import drift
from stages.core.runner import RunContext
from stages.evaluate import evaluation
from stages.grpo import training as grpo
from tests.conftest import REPO, smoke_data
from tests.unit.test_records import checkpoint_stage

ORIGINAL_EXIT = os._exit  # as the test process started

MY_REWARD = "tests.plugins.my_reward"
A, B = "a" * 64, "b" * 64
RIGHT = "<reasoning>2 and 2</reasoning><answer>4</answer>"
WORDY = "<reasoning>" + "two and two " * 20 + "</reasoning><answer>4</answer>"


@pytest.fixture(autouse=True)
def _forget_plugins() -> Iterator[None]:
    """Each test starts as a new process would: no plugin imported, only FAR's rewards."""
    saved, kinds = dict(os.environ), set(registry.REGISTRY)
    modules = set(sys.modules)
    yield
    os.environ.clear()
    os.environ.update(saved)
    for name in set(rewards.REGISTRY) - rewards.BUILTIN:
        rewards.unregister_reward(name)
    for kind in set(registry.REGISTRY) - kinds:
        registry.unregister(kind)
    for module in set(sys.modules) - modules:
        if module.startswith("tests.plugins.") or module.startswith("far_user_"):
            sys.modules.pop(module)
            plugins.LOADED.pop(module, None)


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _recipe(tmp_path: Path, **fields: Any) -> str:
    data = {**smoke_data(), "storage_root": str(tmp_path / "runs"), **fields}
    data["grpo"] = {**data["grpo"], "rewards": {"format_strict": 0.5, "concise_correct": 1.0}}
    path = tmp_path / "my-task.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _far(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == cli.EXIT_INVALID and len(lines) == 1 and lines[0].startswith("far: "), err
    return lines[0]


def test_far_rewards_register_the_way_a_plugin_does() -> None:
    assert set(rewards.BUILTIN) == {
        "format_strict",
        "format_approx",
        "answer_match",
        "reasoning_quality",
        "math_equivalent",
        "code_pass_rate",
        "random",
    }
    for name in rewards.BUILTIN:
        assert rewards.REGISTRY[name].module == "stages.rewards"
        assert rewards.REGISTRY[name].digest is None  # STAGE_VERSION covers FAR's own
    with pytest.raises(rewards.DuplicateReward, match=r"'answer_match' is registered already"):
        rewards.register_reward("answer_match", lambda c, r: 1.0)
    for bad in ("preset", "has space", "", "reward/x"):
        with pytest.raises(ValueError, match="expected an identifier"):
            rewards.register_reward(bad, lambda c, r: 1.0)
    with pytest.raises(ValueError, match="FAR's own"):
        rewards.unregister_reward("format_strict")


def test_far_validate_checks_a_plugin_reward_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe(tmp_path)
    code, _, err = _far(capsys, "validate", recipe)  # no plugin: an unknown reward
    line = _one_line(code, err)
    assert "grpo.rewards: unknown reward 'concise_correct'; registered rewards: [" in line
    assert "'answer_match'" in line and "--plugin" in line
    code, out, err = _far(capsys, "validate", recipe, "--plugin", MY_REWARD)
    assert code == 0, err
    assert "valid" in out
    code, out, err = _far(capsys, "validate", recipe, "--plugin", MY_REWARD)  # loaded already
    assert code == 0, err
    data = yaml.safe_load(Path(recipe).read_text())
    Path(recipe).write_text(yaml.safe_dump({**data, "eval": {"rewards": ["concise_correct"]}}))
    assert _far(capsys, "validate", recipe, "--plugin", MY_REWARD)[0] == 0
    rewards.unregister_reward("concise_correct")
    sys.modules.pop(MY_REWARD)
    data["grpo"]["rewards"] = {"format_strict": 1.0}
    Path(recipe).write_text(yaml.safe_dump({**data, "eval": {"rewards": ["concise_correct"]}}))
    line = _one_line(*_far(capsys, "validate", recipe)[::2])  # an evaluation's rewards too
    assert "eval.rewards: unknown reward 'concise_correct'" in line
    assert not (tmp_path / "runs").exists()


def test_the_recipe_names_its_plugins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recipe's `plugins:` does what --plugin does (a deployment has no command line)."""
    code, _, err = _far(capsys, "validate", _recipe(tmp_path, plugins=[MY_REWARD]))
    assert code == 0, err
    typo = _recipe(tmp_path, plugins=[MY_REWARD])
    Path(typo).write_text(Path(typo).read_text().replace("concise_correct", "concise_corect"))
    line = _one_line(*_far(capsys, "validate", typo)[::2])
    assert "unknown reward 'concise_corect'" in line and "did you mean 'concise_correct'?" in line
    missing = _recipe(tmp_path, plugins=["far_no_such_module"])
    line = _one_line(*_far(capsys, "validate", missing)[::2])
    assert "plugins[0] 'far_no_such_module': cannot import it" in line
    bad = _recipe(tmp_path, plugins=["not a module"])
    assert "is not a dotted module name" in _far(capsys, "validate", bad)[2]


def test_a_plugin_whose_reward_lives_in_another_module_is_known_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plugin, then the recipe's plugins (and a resume's run.json) name the same module: it
    was imported once, and is still known for the reward it registered from another module."""
    _module(tmp_path, monkeypatch, "far_user_scores", "def short(c, r):\n    return 1.0\n")
    plugin = _module(
        tmp_path,
        monkeypatch,
        "far_user_plugin",
        "from far_user_scores import short\n"
        "from stages.rewards import register_reward\n"
        "register_reward('concise_correct', short)\n",
    )
    recipe = _recipe(tmp_path, plugins=[plugin])
    code, _, err = _far(capsys, "validate", recipe, "--plugin", plugin)
    assert code == 0, err
    assert rewards.REGISTRY["concise_correct"].module == "far_user_scores"
    run_json = plugins.recorded_modules(load_recipe(_recipe(tmp_path)))  # by --plugin alone
    assert run_json == ["far_user_plugin"]  # the module whose import registers it


def test_the_recipe_plugins_field_leaves_stage_hashes_and_drift_alone(tmp_path: Path) -> None:
    """An absent or empty `plugins:` is today's recipe: the same stage configs, no drift."""
    data = {**smoke_data(), "storage_root": str(tmp_path)}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**data, "plugins": [MY_REWARD]}))
    plain, named = load_recipe(str(tmp_path / "a.yaml")), load_recipe(str(tmp_path / "b.yaml"))
    assert plain.plugins == [] and named.plugins == [MY_REWARD]
    before = grpo.identity(plain.grpo, plain.model, A, B)
    assert grpo.identity(named.grpo, named.model, A, B).digest == before.digest
    assert drift.recipe_changes(plain.model_dump(mode="json"), named.model_dump(mode="json")) == []


@pytest.mark.parametrize(
    ("source", "says"),
    [
        (
            "from stages.rewards import reward\n@reward('answer_match')\ndef f(c, r): return 1.0\n",
            "reward 'answer_match' is registered already (by stages.rewards)",
        ),
        (
            "from stages.rewards import reward\n@reward('preset')\ndef f(c, r): return 1.0\n",
            "reward name 'preset'",
        ),
        ("X = 1\n", "registered no stage kind and no reward"),
    ],
    ids=["duplicate", "reserved-name", "nothing"],
)
def test_a_reward_plugin_that_cannot_work_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    says: str,
) -> None:
    name = _module(tmp_path, monkeypatch, "far_user_bad", source)
    line = _one_line(*_far(capsys, "validate", _recipe(tmp_path), "--plugin", name)[::2])
    assert line.startswith("far: --plugin far_user_bad: ") and says in line, line
    assert set(rewards.REGISTRY) == rewards.BUILTIN  # nothing left behind


def test_a_plugin_registering_a_reward_and_a_kind_keeps_both_or_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "from stages.rewards import reward\n"
        "from stages.registry import StageSpec, register\n"
        "from schemas.recipe import HardSubsetConfig\n"
        "@reward('far_user_score')\ndef f(c, r): return 0.0\n"
        "register(StageSpec('far_user_kind', HardSubsetConfig, {entry!r}, 'dataset'))\n"
    )
    broken = _module(tmp_path, monkeypatch, "far_user_both", source.format(entry="nowhere:run"))
    with pytest.raises(registry.PluginError, match="cannot be imported"):
        plugins.load_plugin(broken)
    assert "far_user_score" not in rewards.REGISTRY and "far_user_kind" not in registry.REGISTRY
    Path(tmp_path / "far_user_both.py").write_text(source.format(entry="stages.pick:run"))
    found = plugins.load_plugin(broken)
    assert found == plugins.Registered(("far_user_kind",), ("far_user_score",))


def test_grpo_and_evaluation_call_the_plugin_reward() -> None:
    """The callables GRPO hands Tunix and the evaluation's extra rewards score with it, here in
    the grader's process, with the completion as a plain string."""
    plugins.load_plugin(MY_REWARD)
    kwargs = {
        "prompts": ["p"] * 3,
        "completions": [RIGHT, WORDY, "<answer>5</answer>"],
        "answer": np.asarray(["4"] * 3),
        "tests": np.asarray(["[]"] * 3),
    }
    (fn,) = rewards.tunix_reward_fns({"concise_correct": 2.0})
    assert fn.__name__ == "concise_correct" and fn(**kwargs) == [2.0, 1.0, 0.0]
    rows = [{"answer": "4"}] * 3
    stats = rewards.SandboxStats()
    scored = evaluation.extra_rewards(rows, kwargs["completions"], ["concise_correct"], stats)
    assert scored == {"reward/concise_correct": [1.0, 0.5, 0.0]}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("return float('nan')", "scored nan for completion 0 'x'; expected a finite number"),
        ("return 'high'", "scored 'high' for completion 0 'x'"),
        ("return None", "scored None for completion 0 'x'; expected a finite number"),
        ("raise KeyError('answer')", "raised KeyError: 'answer'"),
        ("import sys; sys.exit(0)", "called sys.exit(0)"),
        ("raise SystemExit", "called sys.exit(None)"),
        ("import os; os._exit(0)", "called os._exit(0)"),  # the test process lives on
    ],
)
def test_a_plugin_reward_that_misbehaves_stops_with_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, says: str
) -> None:
    source = f"from stages.rewards import reward\n@reward('far_user_odd')\ndef f(c, r): {body}\n"
    plugins.load_plugin(_module(tmp_path, monkeypatch, "far_user_odd", source))
    (fn,) = rewards.tunix_reward_fns({"far_user_odd": 1.0})
    with pytest.raises(rewards.RewardFailed, match=r"reward 'far_user_odd' \(far_user_odd\)") as e:
        fn(prompts=["p"], completions=["x"], answer=np.asarray(["1"]))
    assert says in str(e.value)
    assert os._exit is ORIGINAL_EXIT  # the guard is gone once the reward returned


def test_os_exit_outside_a_reward_and_in_a_rewards_child_process_still_exits(
    tmp_path: Path,
) -> None:
    """Only the reward's own thread is guarded: a child process the reward forks exits with
    its code (multiprocessing's children end with os._exit), and os._exit is the original
    again after the call."""
    from stages.rewards.guard import CallLimit, call_within

    def forks() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(7)  # in the child: must exit, not raise into a copy of the reward
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    assert call_within("forks", "tests", forks, CallLimit(seconds=30)) == 7
    assert os._exit is ORIGINAL_EXIT


def _identities(config_rewards: list[str]) -> dict[str, str]:
    recipe = load_recipe(str(REPO / "recipes" / "smoke.yaml"))
    weights = dict.fromkeys(config_rewards, 1.0)
    return {
        "grpo": grpo.identity(
            GRPOConfig(max_steps=1, batch_size=1, rewards=weights), recipe.model, A, B
        ).digest,
        "evaluate": evaluation.identity(
            EvalConfig(rewards=config_rewards), recipe.model, A, {"sft": B}
        ).digest,
        "self_teach": self_teach.identity(
            SelfTeachConfig(verify=config_rewards), recipe.model, A, B
        ).digest,
    }


def test_the_reward_source_is_in_the_stage_hash_and_lineage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Editing the reward module moves the hash of every stage that uses it (a stale result is
    never reused); the committed record names the digest and `far lineage` prints it."""
    source = (
        "from stages.rewards import reward\n"
        "@reward('far_user_len')\ndef f(c, r):\n    return min(len(c), {cap}) / {cap}\n"
    )
    module = _module(tmp_path, monkeypatch, "far_user_len", source.format(cap=10))
    plugins.load_plugin(module)
    digest = rewards.REGISTRY["far_user_len"].digest
    assert digest is not None and len(digest) == 64
    first = _identities(["far_user_len"])
    ident = grpo.identity(
        GRPOConfig(max_steps=1, batch_size=1, rewards={"far_user_len": 1.0}),
        load_recipe(str(REPO / "recipes" / "smoke.yaml")).model,
        A,
        B,
    )
    label = "source:reward:far_user_len:far_user_len"
    assert ident.inputs[label] == digest
    path = _recipe(tmp_path)
    Path(path).write_text(Path(path).read_text().replace("concise_correct", "far_user_len"))
    recipe = load_recipe(path)
    ctx = RunContext(root=recipe.storage_root, run=recipe.name, node="grpo")
    manifest.open_session(recipe, ctx, path)  # run.json records the reward's module
    assert manifest.read_manifest(ctx.run_uri).plugins == ["far_user_len"]
    sources = {k: v for k, v in ident.inputs.items() if k.startswith("source:")}
    done = checkpoint_stage(ctx, "grpo", sources, {})
    assert cli.main(["lineage", done.output.uri]) == 0
    assert f"source reward:far_user_len:far_user_len ({digest})" in capsys.readouterr().out

    rewards.unregister_reward("far_user_len")  # the module edited, as in a later process
    sys.modules.pop(module)
    (tmp_path / "far_user_len.py").write_text(source.format(cap=100))  # another size: no .pyc
    plugins.load_plugin(module)
    assert rewards.REGISTRY["far_user_len"].digest != digest
    second = _identities(["far_user_len"])
    assert all(first[stage] != second[stage] for stage in first), (first, second)
    edited = rewards.reward_sources(["far_user_len"])
    with pytest.raises(drift.DriftError, match=r"code\.rewards\.far_user_len: "):
        checkpoint_stage(ctx, "grpo", edited, {})  # the run's stage is not redone silently
    allowed = dataclasses.replace(ctx, allow_changes=("code.rewards",))
    assert checkpoint_stage(allowed, "grpo", edited, {}).record_uri != done.record_uri
    # FAR's own rewards add nothing to the hash (the pinned hashes stay where they were)
    assert all(rewards.reward_sources([name]) == {} for name in rewards.BUILTIN)
