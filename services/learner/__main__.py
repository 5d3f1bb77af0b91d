"""`python -m magic.learner`: run the learner service (same as `magic serve learner`)."""

import sys

from magic.cli import serve_service

sys.exit(serve_service("learner"))
