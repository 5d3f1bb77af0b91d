"""`python -m magic.learner`: run the learner service (same as `magic serve learner`)."""

import sys

from magic.learner.worker import run

sys.exit(run())
