"""The name transformers' models take and return their KV cache under.

transformers 5.24 renamed `past_key_values` to `cache` (the old name still works there, with a
FutureWarning on every call, and goes in 5.40); earlier releases know only `past_key_values`.
The generation engine and the training pass use these two helpers, so both names work and no
run prints the warning.
"""

from __future__ import annotations

from functools import cache
from typing import Any

RENAMED_IN = "5.24.0.dev0"


@cache
def cache_keyword() -> str:
    """`cache` on transformers >= 5.24, else `past_key_values`."""
    import transformers
    from packaging.version import Version

    return "cache" if Version(transformers.__version__) >= Version(RENAMED_IN) else "past_key_values"


def with_cache(kv: Any) -> dict[str, Any]:
    """The keyword argument that passes `kv` to a model's forward."""
    return {cache_keyword(): kv}


def cache_of(output: Any) -> Any:
    """The KV cache a model's forward returned."""
    return getattr(output, cache_keyword())
