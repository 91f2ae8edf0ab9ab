"""Type checkers' view of the kept path fastloop.images: at run time it is fastloop.data.images itself."""

from .data.images import *  # noqa: F403
