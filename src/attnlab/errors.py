"""Errors a user can fix. The entry points print them as one paragraph, without a traceback."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix."""


class SettingError(UserError, ValueError):
    """A network's settings that do not fit together, named as the constructor's parameters (`n_embd=100`); the
    entry points show them as the model's settings (model.*), where a run sets them."""

    def __str__(self) -> str:
        return f"the network's settings (model.* of a run): {super().__str__()}"
