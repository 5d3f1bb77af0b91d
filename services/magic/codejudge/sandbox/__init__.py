"""Running untrusted programs: the slots and their helper (`runner.py`), the helper itself, a
standard-library-only program run under bubblewrap (`child.py`), and the confinement (`confine.py`)."""
