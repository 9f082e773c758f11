"""`python -m mtrl_cli`: the `mtrl` command."""

import sys

from mtrl_cli.main import main

sys.exit(main())
