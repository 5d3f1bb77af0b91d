"""Code answers: the test cases of a problem (`cases.py`) and the verifier that runs a response's
program against them in the sandbox (`verifier.py`)."""
