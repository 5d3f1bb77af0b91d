"""The process runtime: the serve loop every worker service shares (`service.py`), child processes
that die with their parent, fault injection at named commit points (tests), and the HTTP client of
long-lived uvicorn servers."""
