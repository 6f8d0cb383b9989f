"""My reward, in TRL's batch form: is the answer the row's word spelled backwards?"""

import re

from stages.rewards import reward


@reward("reversed_word")
def reversed_word(prompts, completions, word, **columns):  # type: ignore[no-untyped-def]
    """1.0 when the completion's <answer> is the row's `word` column reversed, else 0.0."""
    found = [re.search(r"<answer>(.*?)</answer>", c, re.DOTALL) for c in completions]
    return [
        float(f is not None and f[1].strip() == w[::-1]) for f, w in zip(found, word, strict=True)
    ]
