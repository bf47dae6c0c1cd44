"""Errors a user can fix. The entry points print them as one paragraph, without a traceback."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix."""
