"""User-facing errors and the exit codes documented in the README."""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_NOPERM = 77  # sysexits.h EX_NOPERM


class PastaError(Exception):
    """An error the user can act on: printed as one line, no traceback (unless -v)."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def one_line(self) -> str:
        msg = str(self)
        return f"{msg} ({self.hint})" if self.hint else msg


class UsageError(PastaError):
    exit_code = EXIT_USAGE


class PermissionsError(PastaError):
    exit_code = EXIT_NOPERM


class FormatError(PastaError):
    """Not a pasta-trace file, a damaged one, or one from a newer major version."""

    exit_code = EXIT_RUNTIME
