import sys

from fairqueue.cli import main

sys.exit(main())
