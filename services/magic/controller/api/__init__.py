"""The controller's REST API, one router per resource (datasets, runs, stages, status)."""
