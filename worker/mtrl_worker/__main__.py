"""`python -m mtrl_worker`; `main` is also the target of `mtrl worker`."""

import sys

from mtrl_worker.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
