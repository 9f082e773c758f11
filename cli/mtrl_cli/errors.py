"""The one exception the commands report: a failure a person can act on."""

from __future__ import annotations


class CliError(Exception):
    """Its message is the whole report: what failed and where, in one line."""
