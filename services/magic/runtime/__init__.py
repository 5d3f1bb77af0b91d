"""The process runtime: the serve loop every worker service shares (`service.py`) and its liveness
(`liveness.py`), child processes that die with their parent, fault injection at named commit points
(tests), the HTTP client of long-lived uvicorn servers and the small HTTP server of the metrics and
score ports (`httpserver.py`)."""
