"""Math answers: extraction from a response (`extract.py`), equivalence of two answers
(`equiv.py`), and the verifiers registered by name (`verifier.py`)."""
