"""A reward of my own: full marks for a right answer in at most 40 words of reasoning."""

from stages.rewards import Reference, answer_match, reward

MAX_WORDS = 40


@reward("concise_correct")
def concise_correct(completion: str, ref: Reference) -> float:
    """1.0 for the right answer after at most MAX_WORDS words, 0.5 for a longer right one."""
    if answer_match(completion, ref) == 0.0:
        return 0.0
    return 1.0 if len(completion.split()) <= MAX_WORDS else 0.5
