"""Type checkers' view of the kept path fastloop.datasets: at run time it is fastloop.data.datasets itself."""

from .data.datasets import *  # noqa: F403
