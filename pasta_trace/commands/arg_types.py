"""argparse types for the numbers, PIDs and sizes the verbs take: a value that
is not usable is refused where it enters, as a usage error (exit 2) that says
what to give instead, never carried into the work (NaN compares false with
everything, infinity has no integer, a huge number overflows a nanosecond)."""

from __future__ import annotations

import argparse
import math

#: the largest span any microsecond option may give: a day, far beyond any
#: clock skew or launch tolerance, and far inside int64 nanoseconds
MAX_MICROSECONDS = 86_400e6


def microseconds(text: str) -> float:
    """A finite, non-negative number of microseconds, at most a day."""
    try:
        us = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of microseconds: {text!r}: try 1000") from None
    if not math.isfinite(us) or not 0 <= us <= MAX_MICROSECONDS:
        raise argparse.ArgumentTypeError(
            f"{text} is not a number of microseconds in 0..{MAX_MICROSECONDS:.0f}: try 1000")
    return us


def pids(text: str) -> list[int]:
    """-p's PID[,PID...] list."""
    try:
        found = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a PID list: {text!r}: try -p 1234 or -p 1234,1240") from None
    if not found:
        raise argparse.ArgumentTypeError("empty PID list: try -p 1234 or -p 1234,1240")
    return found


def _whole(text: str, what: str, example: int) -> int:
    """``text`` as an integer, or a usage error naming ``what`` with an example."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of {what}: {text!r}: try {example}") from None


def pages(text: str) -> int:
    """A BPF ring buffer size in pages: a power of two the kernel accepts."""
    from ..capture.session.options import MAX_RING_PAGES

    n = _whole(text, "pages", 4096)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} pages: give at least 1 (a power of two): try 4096")
    if n > MAX_RING_PAGES:
        raise argparse.ArgumentTypeError(
            f"{n} pages is more than a BPF ring buffer can hold (2 GiB): try {MAX_RING_PAGES}")
    if n & (n - 1):
        raise argparse.ArgumentTypeError(f"{n} is not a power of two: try {min(1 << n.bit_length(), MAX_RING_PAGES)}")
    return n


def rows(text: str) -> int:
    """Rows of the --aggregate map (allocated whole when the program loads)."""
    from .. import schema

    default, most = schema.DEFAULT_AGGREGATE_MAX, schema.MAX_AGGREGATE_MAX
    n = _whole(text, "rows", default)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} rows: give at least 1: try {default}")
    if n > most:
        raise argparse.ArgumentTypeError(f"{n} rows is more than the map may take (about 512 MiB of kernel "
                                         f"memory): try {most}")
    return n


def seconds(text: str) -> float:
    """A positive, finite number of seconds (-d, -i)."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}: try 10") from None
    if not math.isfinite(s) or s <= 0:  # nan compares false with everything: it would never end
        raise argparse.ArgumentTypeError(f"{text} is not a positive finite number of seconds: try 10")
    return s


def depth(text: str) -> int:
    """Python frames kept per stack (--stack-depth)."""
    from .. import schema

    n = _whole(text, "frames", schema.DEFAULT_STACK_DEPTH)
    if not 1 <= n <= schema.MAX_STACK_DEPTH:
        raise argparse.ArgumentTypeError(f"{n} is not in 1..{schema.MAX_STACK_DEPTH}: "
                                         f"try {min(max(n, 1), schema.MAX_STACK_DEPTH)}")
    return n
