"""`python -m magic.codejudge`: run the code judge (same as `magic serve codejudge`)."""

import sys

from magic.codejudge.service import run

sys.exit(run())
