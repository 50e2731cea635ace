"""The one exception type that means "the user asked for something that cannot work"."""


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit status 2, never a traceback.

    The message names the problem and what to change, e.g.
    "optim.lr must be > 0, got -0.1: pass --set optim.lr=0.01".
    """

    exit_code = 2

    def __init__(self, message: str, *, shared: bool = False):
        super().__init__(message)
        # True when every rank raised this same error, so rank 0 alone need report it.
        self.shared = shared
