"""``python -m agentsim ...``: the ``agentsim`` command (what torchrun starts on every rank)."""

import sys

from agentsim.cli.main import main

sys.exit(main())
