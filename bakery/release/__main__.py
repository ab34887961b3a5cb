"""`python -m bakery.release`: the command of bakery.release.ci."""

import sys

from bakery.release.ci import main

sys.exit(main())
