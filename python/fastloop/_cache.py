"""Where fastloop keeps data it can make again (the demo's images, tar shard indexes)."""

from __future__ import annotations

import os


def cache_root() -> str:
    """$FASTLOOP_CACHE, else $XDG_CACHE_HOME/fastloop, else ~/.cache/fastloop."""
    explicit = os.environ.get("FASTLOOP_CACHE")
    if explicit:
        return explicit
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastloop")
