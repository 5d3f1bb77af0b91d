"""What ends a run."""


class RunFailed(RuntimeError):
    """The run cannot go on; the message is shown in its status."""
