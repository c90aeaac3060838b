"""``python -m store_node.analytics``: the same as ``store-node analytics``."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
