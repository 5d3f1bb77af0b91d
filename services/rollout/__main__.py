"""`python -m magic.rollout`: run the rollout service (same as `magic serve rollout`)."""

import sys

from magic.cli import serve_service

sys.exit(serve_service("rollout"))
