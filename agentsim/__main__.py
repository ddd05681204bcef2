"""``python -m agentsim ...``: the ``agentsim`` command (what torchrun starts on every rank)."""

import sys

from .cli import main

sys.exit(main())
