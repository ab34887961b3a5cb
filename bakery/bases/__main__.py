"""`python -m bakery.bases`: the command of bakery.bases.make."""

import sys

from bakery.bases.make import main

sys.exit(main())
