"""`python -m magic.controller`: run the controller service (same as `magic serve controller`)."""

import sys

from magic.cli import serve_service

sys.exit(serve_service("controller"))
