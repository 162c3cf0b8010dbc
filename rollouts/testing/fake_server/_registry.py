"""Which wire formats a FakeServer speaks by default.

To add a provider format, write `rollouts/testing/fake_server/<name>.py` with a class
implementing `WireFormat` and add `"<module>:<Class>"` to `FORMATS` below. Modules that do
not exist yet are skipped, so formats can land one at a time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollouts.testing.fake_server.server import WireFormat

FORMATS: tuple[str, ...] = (
    "rollouts.testing.fake_server.chat:ChatCompletionsFormat",
    "rollouts.testing.fake_server.anthropic_format:AnthropicFormat",
    "rollouts.testing.fake_server.responses_format:ResponsesFormat",
    "rollouts.testing.fake_server.gemini_format:GeminiFormat",
)


def all_formats() -> tuple[WireFormat, ...]:
    """An instance of every available format in `FORMATS` (missing modules skipped)."""
    out = []
    for target in FORMATS:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise  # a real import error inside an existing module
            continue
        out.append(getattr(module, attr)())
    return tuple(out)
