"""FAR's fast paths through Tunix and qwix, installed only while a stage that asked runs.

FAR's own performance features (completion-only log-probs and the entropy from the same
projection, the last-position prefill, the sampler's draw, the bfloat16 vocabulary table,
qwix's LoRA backward) are functions of stages/modeling/tunix_compat.py that Tunix and qwix
reach through a module or class attribute they read at each call. Where Tunix takes a function
(PeftTrainer.with_loss_fn) or a class (RLCluster's rollout engine) FAR hands it over and needs
nothing here; the rest are swapped in by `installed(...)`, a context that a stage enters for
its whole run (the `scoped` decorator on its entry function) and that puts back what it
replaced when the last holder leaves. Importing FAR changes nothing in Tunix or qwix
(tests/unit/test_fast_paths.py checks identity before, inside and after).

A stage entered twice (nested, or two stages on threads of one process) shares one install:
the swaps are counted, and only the last exit restores. The replacements are looked up when
installed, so a test may wrap one (monkeypatch tunix_compat's attribute) before a stage runs.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from qwix import version as qwix_version
from qwix._src.providers import lora as qwix_lora
from tunix.generate import sampler as tunix_sampler
from tunix.models.gemma3 import model as gemma3_model
from tunix.rl import common as rl_common

from stages.modeling import tunix_api, tunix_compat

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Swap:
    """One attribute of Tunix or qwix (`owner.name`) replaced by tunix_compat's `replacement`
    (an attribute name, read when installed)."""

    owner: Any
    name: str
    replacement: str


def _lora_swaps() -> tuple[Swap, ...]:
    """qwix's LoRA delta, on the qwix versions the written-out backward was checked on."""
    if qwix_version.__version__ not in tunix_compat.TESTED_QWIX_VERSIONS:
        return ()
    return (Swap(qwix_lora, "_compute_lora_delta", "_lora_delta"),)


# name -> what it swaps; each replacement's docstring in tunix_compat says why and its test
PATHS: dict[str, Callable[[], tuple[Swap, ...]]] = {
    # qwix's LoRA linear layers: the adapters' backward without a transposed gradient copy
    "lora_backward": _lora_swaps,
    # Gemma 3 accepts the Sampler's decode_only_last_token: the prefill projects one position
    "prefill_last_position": lambda: (Swap(gemma3_model.Gemma3, "__call__", "_gemma3_call"),),
    # every RL log-prob projects the completion only; the entropy comes from that projection
    "completion_logps": lambda: (
        Swap(rl_common, "compute_per_token_logps", "completion_per_token_logps"),
        Swap(tunix_api.ENTROPY_MODULE, "compute_entropy_from_logits", "_entropy_from_logits"),
    ),
    # a Sampler draws by its own draw (tunix_compat.set_draw: gumbel or inverse_cdf)
    "draw": lambda: (Swap(tunix_sampler.Sampler, "_sample", "_sample_by_draw"),),
    # the embedder's decode reads a bfloat16 table where one is attached (attach_vocab_table)
    "vocab_table": lambda: (Swap(gemma3_model.Embedder, "decode", "_embedder_decode"),),
}
ALL = tuple(PATHS)


@dataclass
class _Held:
    """An installed fast path: how many holders, and the attributes it replaced."""

    holders: int
    originals: tuple[tuple[Swap, Any], ...]


_lock = threading.Lock()
_held: dict[str, _Held] = {}


def _install(name: str) -> None:
    with _lock:
        held = _held.get(name)
        if held is not None:
            held.holders += 1
            return
        swaps = PATHS[name]()
        originals = tuple((swap, getattr(swap.owner, swap.name)) for swap in swaps)
        for swap in swaps:
            setattr(swap.owner, swap.name, getattr(tunix_compat, swap.replacement))
        _held[name] = _Held(1, originals)


def _release(name: str) -> None:
    with _lock:
        held = _held[name]
        held.holders -= 1
        if held.holders:
            return
        for swap, original in reversed(held.originals):
            setattr(swap.owner, swap.name, original)
        del _held[name]


@contextlib.contextmanager
def installed(*names: str) -> Iterator[None]:
    """FAR's fast paths `names` (keys of PATHS) installed in Tunix and qwix for this block;
    on exit, what they replaced is back (once no other holder needs them)."""
    unknown = sorted(set(names) - set(PATHS))
    if unknown:
        raise ValueError(f"fast paths {unknown}: expected some of {sorted(PATHS)}")
    with contextlib.ExitStack() as stack:
        for name in names:
            _install(name)
            stack.callback(_release, name)
        yield


def active(name: str) -> bool:
    """Whether fast path `name` is installed now."""
    with _lock:
        return name in _held


def scoped(*names: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A stage entry function's decorator: its whole run inside `installed(*names)`."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with installed(*names):
                return function(*args, **kwargs)

        return run

    return decorate
