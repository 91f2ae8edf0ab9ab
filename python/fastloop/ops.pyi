"""Type checkers' view of the kept path fastloop.ops: at run time it is fastloop.data.ops itself."""

from .data.ops import *  # noqa: F403
