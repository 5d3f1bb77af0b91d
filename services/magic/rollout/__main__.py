"""`python -m magic.rollout`: run the rollout service (same as `magic serve rollout`)."""

import sys

from magic.rollout.worker import run

sys.exit(run())
