import sys

from mtrl_worker.cli import main

sys.exit(main(sys.argv[1:]))
