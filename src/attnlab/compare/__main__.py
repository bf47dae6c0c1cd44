"""`python -m attnlab.compare`: the same as `attnlab-compare`."""

import sys

from attnlab.compare.cli import main

sys.exit(main())
