"""Whether a string is spelled as a host name (RFC 1123 labels), with no lookup: the engine's
metrics endpoint (`--host`) and the dashboard's `--address` check it before any socket is opened.
"""

from __future__ import annotations

import re

_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\.?$")


def is_host_name(text: str) -> bool:
    """Whether `text` is spelled as a host name (RFC 1123 labels); no lookup."""
    return bool(_HOSTNAME.match(text))


__all__ = ["is_host_name"]
