"""My reward: the reference number, written plainly, inside the answer."""

from stages.rewards import Reference, reward
from stages.rewards.answers import extract_answer


@reward("plain_number")
def plain_number(completion: str, ref: Reference) -> float:
    """1.0 when the answer is exactly the reference (no units, no decimals, no words)."""
    answer = extract_answer(completion, ref.answer_format)
    return 1.0 if answer is not None and answer.strip() == ref.answer.strip() else 0.0
