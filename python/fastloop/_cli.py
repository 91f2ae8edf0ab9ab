"""What the command-line parsers (demo, bench, serve) share: a help formatter."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsFormatter"]


class DefaultsFormatter(argparse.HelpFormatter):
    """Adds "(default: X)" to an option's help once: not when the help already says its
    default, and not for a flag (False) or an option without one (None)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if "default" in help_text or any(action.default is none for none in (None, False, argparse.SUPPRESS)):
            return help_text
        return help_text + " (default: %(default)s)"
