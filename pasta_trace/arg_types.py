"""argparse types for the numbers and addresses the verbs take: a value that
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
