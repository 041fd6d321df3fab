"""``python -m fairqueue.cli``: the ``fairqueue`` command."""

import sys

from fairqueue.cli import main

sys.exit(main())
