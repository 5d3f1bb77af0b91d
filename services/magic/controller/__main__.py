"""`python -m magic.controller`: run the controller service (same as `magic serve controller`)."""

import sys

from magic.controller.app import run

sys.exit(run())
