"""Type checkers' view of the kept path fastloop.loader: at run time it is fastloop.data.loader itself."""

from .data.loader import *  # noqa: F403
