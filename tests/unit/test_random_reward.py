"""The `random` reward, GRPO's negative control: 0 or 1 with even odds, independent of the
completion's text and of the answer, the same draws for the same prompts in the same order
(a resumed run's), different draws across a group's completions."""

from __future__ import annotations

from stages import rewards
from stages.rewards import random_draw

PROMPTS = [f"<start_of_turn>user\nCalculate {i} + {i % 7} - 3<end_of_turn>" for i in range(64)]


def scores(completions: list[str], prompts: list[str], answers: list[str]) -> list[float]:
    (fn,) = rewards.tunix_reward_fns({"random": 1.0})
    return fn(prompts=prompts, completions=completions, answer=answers)


def test_the_draw_ignores_the_text_and_the_answer() -> None:
    prompts = [p for p in PROMPTS for _ in range(8)]  # 64 groups of 8, as GRPO calls it
    right = scores(["<answer>1</answer>"] * len(prompts), prompts, ["1"] * len(prompts))
    other = scores([f"noise {i}" for i in range(len(prompts))], prompts, ["7"] * len(prompts))
    assert right == other
    assert set(right) == {0.0, 1.0}
    assert 0.4 < sum(right) / len(right) < 0.6  # even odds (512 draws: 0.5 +- 0.022 sd)
    groups = [right[i : i + 8] for i in range(0, len(right), 8)]
    assert sum(len(set(g)) == 2 for g in groups) > 50  # within a group the draws differ


def test_the_draws_are_fixed_by_prompt_and_place_in_its_group() -> None:
    prompts = [PROMPTS[0]] * 4 + [PROMPTS[1]] * 4
    first = scores(["x"] * 8, prompts, ["0"] * 8)
    again = scores(["y"] * 8, prompts, ["0"] * 8)  # a resumed run: the same prompts, in order
    assert first == again
    assert first == [random_draw(PROMPTS[0], j) for j in range(4)] + [
        random_draw(PROMPTS[1], j) for j in range(4)
    ]
    assert random_draw(PROMPTS[0], 0, seed=1) in (0.0, 1.0)
    assert [random_draw(PROMPTS[0], j, seed=1) for j in range(32)] != [
        random_draw(PROMPTS[0], j) for j in range(32)
    ]  # the seed moves the draws
