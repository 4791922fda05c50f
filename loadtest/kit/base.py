"""What every module of the kit shares: the repository's paths and KitError."""

import os

LOADTEST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(LOADTEST)
# Where make builds the C programs the tools run: $BUILD (make's, absolute),
# else <repo>/build.
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
HTTP_TIMEOUT = 15.0         # seconds, every HTTP call unless told otherwise


class KitError(Exception):
    """A command, psql, the stack or an HTTP call failed; the message says how."""
