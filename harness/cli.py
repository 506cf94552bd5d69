"""What the command lines (study, report, play, train) share: a parser whose mistakes are one line."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """``argparse`` with its descriptions kept as written, and a mistake on the command line said
    in one line on stderr (exit status 2), not after the whole usage."""

    def __init__(self, prog: str, description: str | None) -> None:
        super().__init__(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} ({self.prog} --help for usage)", file=sys.stderr)
        sys.exit(2)
