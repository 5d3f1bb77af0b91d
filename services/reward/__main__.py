"""`python -m magic.reward`: run the reward service (same as `magic serve reward`)."""

import sys

from magic.cli import serve_service

sys.exit(serve_service("reward"))
