"""What an operator sees: metric names and the /metrics, /livez, /readyz endpoint (`metrics.py`),
and one log line per record (`logs.py`)."""
