"""`python -m magic.reward`: run the reward service (same as `magic serve reward`)."""

import sys

from magic.reward.worker import run

sys.exit(run())
