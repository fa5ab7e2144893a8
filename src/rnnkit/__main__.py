"""``python -m rnnkit`` runs the command line."""

import sys

from rnnkit.cli.main import main

sys.exit(main())
