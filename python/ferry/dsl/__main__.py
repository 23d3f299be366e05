"""``python -m ferry.dsl``: see ferry.dsl.cli."""

import sys

from .cli import main

sys.exit(main())
