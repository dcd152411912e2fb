"""``python -m pytorchtricks.cli``: the ``ptt`` command line."""

import sys

from pytorchtricks.cli import main

sys.exit(main())
