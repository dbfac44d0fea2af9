"""The one exception type that means "the user can fix this".

The CLI turns a `UserError` into one line on stderr and exit code 2; anything else
is a bug and keeps its traceback (shown in full with `--debug`).
"""


class UserError(Exception):
    """Bad input: a file, key or value the user controls. The message says what to do."""

    exit_code = 2
