"""Start the command of `pasta-trace -- CMD ARGS`, held before exec.

The child is a tiny Python wrapper that waits on a pipe, then execs CMD: its
PID is known before CMD runs a single instruction, so the session can put it
in the BPF pid filter and attach the probes first.  Only the go byte lets it
exec: the end of the pipe (the set-up failed, or pasta-trace died, before
release) makes it exit without running CMD, never run it untraced.  Under sudo the command
runs as the invoking user (SUDO_UID / SUDO_GID).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys

from ...errors import PastaError, UsageError
from ...safe_output import invoking_user

_WRAPPER = (
    "import os,sys\n"
    "fd=int(sys.argv[1])\n"
    "if os.read(fd,1)!=b'g':\n"
    "    os._exit(125)\n"
    "os.close(fd)\n"
    "try:\n"
    "    os.execvp(sys.argv[2],sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'pasta-trace: error: cannot run {sys.argv[2]}: {e.strerror}\\n')\n"
    "    os._exit(127)\n"
)


def check_command(argv: list[str], env: dict[str, str]) -> None:
    """The command can be started: checked before anything is loaded or written."""
    if not argv:
        raise UsageError("nothing to run after `--`")
    if "/" in argv[0]:
        if not os.path.exists(argv[0]):
            raise UsageError(f"command not found: {argv[0]}")
        if os.path.isdir(argv[0]) or not os.access(argv[0], os.X_OK):
            raise UsageError(f"cannot run {argv[0]}: not an executable file")
    elif shutil.which(argv[0], path=env.get("PATH")) is None:
        here = os.path.isfile(argv[0])  # the shell does not look in the current directory either
        raise UsageError(f"command not found: {argv[0]}", hint=f"it is not in PATH: give its path, ./{argv[0]}"
                         if here else None)


class HeldCommand:
    def __init__(self, argv: list[str], env: dict[str, str]):
        check_command(argv, env)
        self.argv = argv
        self.released = False
        r, self._go = os.pipe()
        user = invoking_user()
        kwargs: dict = {}
        if user is not None:
            uid, gid = user
            name = pwd.getpwuid(uid).pw_name
            kwargs = {"user": uid, "group": gid, "extra_groups": os.getgrouplist(name, gid)}
            env = {**env, "HOME": pwd.getpwuid(uid).pw_dir, "USER": name, "LOGNAME": name}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-E", "-c", _WRAPPER, str(r), *argv],
                env=env, pass_fds=(r,), **kwargs,
            )
        except OSError as e:
            raise PastaError(f"cannot start {argv[0]}: {e.strerror}") from None
        finally:
            os.close(r)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        """Let the command exec."""
        os.write(self._go, b"g")
        os.close(self._go)
        self.released = True

    def poll(self) -> int | None:
        return self.proc.poll()

    def abandon(self) -> None:
        """The session failed before release: the command must never run, and
        the wrapper not be left waiting.  It is killed, not only told by the
        end of the pipe: it may be stopped (a discover stop nobody resumed yet),
        and a wait for it would never end."""
        try:
            os.close(self._go)
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
