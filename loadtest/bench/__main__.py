"""python3 loadtest/bench: make bench (see bench/__init__.py)."""

import os
import sys

sys.dont_write_bytecode = True
# loadtest/, not this directory, on the path: the kit and the tools are there.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.cli import main  # noqa: E402

sys.exit(main())
