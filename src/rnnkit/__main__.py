"""``python -m rnnkit`` runs the command line."""

import sys

from rnnkit.app.cli.main import main

sys.exit(main())
