"""gradio on the GPU machine (its wheel does not fit what travels there): ``gradio.Error`` alone, which
``prvr.serve.zerogpu.WorkerFailure`` subclasses; no UI runs there."""


class Error(Exception):
    """gradio 6.31's ``Error``: its arguments and the attributes the slots' code reads."""

    def __init__(self, message: str = "Error raised.", duration: float | None = 10, visible: bool = True,
                 title: str = "Error", print_exception: bool = True) -> None:
        super().__init__(message)
        self.message, self.title, self.print_exception = message, title, print_exception
