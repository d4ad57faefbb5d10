"""``python -m tcexport.serving PKG_OR_REPO ...``: the same as ``tcpkg serve``."""

import sys

from .cli import main

sys.exit(main())
