"""The one base class every contract derives from: frozen, strict about unknown fields."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable contract. Unknown fields are errors, so a typo in a recipe never passes."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
