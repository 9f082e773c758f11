"""What every command shares: its name in help and errors (`mtrl runs`, or `kubectl mtrl runs`
when kubectl runs the plug-in), and one line on stderr per failure, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from mtrl_cli.errors import CliError

INTERRUPTED = 130  # a shell's code for a command ended by Ctrl-C


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The command's parser, described by its module's first paragraph. `mtrl_cli.main`
    puts the command's full name in argv[0]; a direct call gets `mtrl <name>`."""
    prog = sys.argv[0] if sys.argv and sys.argv[0].endswith(f"mtrl {name}") else f"mtrl {name}"
    first_paragraph = " ".join((doc or "").split("\n\n")[0].split())
    return argparse.ArgumentParser(prog=prog, description=first_paragraph)


def warn(parser: argparse.ArgumentParser, message: str) -> None:
    """One line on stderr that does not end the command."""
    print(f"{parser.prog}: {message}", file=sys.stderr)


def reported(parser: argparse.ArgumentParser, command: Callable[[], int]) -> int:
    """Run `command`; a CliError becomes `<prog>: message` on stderr and exit 1; Ctrl-C 130."""
    try:
        return command()
    except CliError as exc:
        warn(parser, str(exc))
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED
