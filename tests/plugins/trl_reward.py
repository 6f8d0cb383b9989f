"""A reward in TRL's batch form: the answer with the row's own `unit` column, where it has one."""

from stages.rewards import reward


@reward("answer_with_unit")
def answer_with_unit(prompts, completions, answer, unit=None, **columns):  # type: ignore[no-untyped-def]
    """1.0 when the completion says the answer followed by the row's unit; None (not
    applicable) for a row without a unit."""
    units = unit or [None] * len(completions)
    return [
        None if u is None else float(f"{a} {u}" in c)
        for c, a, u in zip(completions, answer, units, strict=True)
    ]
