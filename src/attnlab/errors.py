"""Errors a user can fix, and the one way they are shown (`fail`): one paragraph on stderr, no traceback, exit
status 2."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

# how a UserError raised in a DataLoader worker appears in the error the worker's parent re-raises
ERROR_MARK = "attnlab.errors.UserError: "


class UserError(Exception):
    """Bad input: the message names the problem and the fix."""


class SettingError(UserError, ValueError):
    """A network's settings that do not fit together, named as the constructor's parameters (`n_embd=100`); its
    message says they are the model's settings (model.*), where a run sets them."""

    def __str__(self) -> str:
        return f"the network's settings (model.* of a run): {super().__str__()}"


def causes(err: BaseException | None) -> Iterator[BaseException]:
    """`err`, the error it was raised from (`__cause__`, else `__context__`), that one's, ...: each once."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def user_message(err: BaseException) -> str:
    """The user-facing paragraph; errors re-raised from DataLoader workers carry the worker's traceback."""
    msg = str(err)
    if ERROR_MARK in msg:
        msg = msg.rsplit(ERROR_MARK, 1)[1]
    return msg.strip()


def fail(e: BaseException) -> None:
    """The one place a UserError is printed: one paragraph on stderr, no traceback, exit status 2; a secret's value
    in it is redacted."""
    from attnlab.redact import redact_text

    msg = redact_text(user_message(e))  # a paragraph may quote a value: never a secret's
    print(f"\nattnlab: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def fail_before_hydra(check: Callable[..., Any], *args: Any) -> Any:
    """Run a check of the command line before Hydra composes (-> what it returns); a UserError stops like one raised
    in a run."""
    try:
        return check(*args)
    except UserError as e:
        fail(e)
