"""Call sites: the Python line that made a call ("file:line function"),
joined onto any frame that has pid and stack_id.  The tools group by it
(`call_sites` and the `*_call_sites` tools) or name each row's top one
(`top_call_site`).

By default a call's site is the *user's line*: the innermost Python frame of
its stack whose file is the user's own, not the interpreter's standard
library, site-packages/dist-packages or a frozen module, so that memory a
library allocates on the user's behalf (an optimizer step, autograd) is
charged to the line that asked for it (``train.py:63 <module>``), not to
``torch/optim/adam.py``.  A stack with no such frame keeps its innermost
frame.  ``report``/``export --call-site innermost`` gives the innermost frame
instead, and ``--user-code PATH`` says which files are the user's (then only
those are)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import polars as pl

from .. import lifetimes, merge
from ..read import Capture

#: the call site of a call without a stack (no Python, --no-stacks, or a lost stack)
NO_STACK = "(no stack)"

#: files that are not the user's: frozen modules, installed packages, and the
#: standard library of any CPython layout (/usr/lib/python3.11/,
#: ~/.pyenv/versions/3.12.1/lib/python3.12/, a venv's lib/python3.13t/)
LIBRARY_FILES = r"^<frozen |/(?:site|dist)-packages/|/lib(?:64)?/python\d+\.\d+[a-z]*/"

MODES = ("user", "innermost")


@dataclass(frozen=True)
class SitePolicy:
    """How a stack names its call site: ``mode`` "user" (the innermost frame
    in the user's code) or "innermost"; ``user_code``: absolute paths (files
    or directories) that are the user's; empty: every file but LIBRARY_FILES."""

    mode: str = "user"
    user_code: tuple[str, ...] = ()


_POLICY_KEY = ("call_site_policy",)


def set_policy(cap: Capture, mode: str = "user", user_code: tuple[str, ...] | list[str] = ()) -> None:
    """Name ``cap``'s call sites by ``mode`` from now on (the verbs' --call-site
    and --user-code)."""
    if mode not in MODES:
        raise ValueError(f"call-site mode {mode!r}: one of {', '.join(MODES)}")
    paths = tuple(os.path.abspath(p).rstrip("/") or "/" for p in user_code)
    cap.cache.pop(("launch_sites",), None)
    cap.cache[_POLICY_KEY] = SitePolicy(mode, paths)


def policy(cap: Capture) -> SitePolicy:
    p = cap.cache.get(_POLICY_KEY)
    return p if isinstance(p, SitePolicy) else SitePolicy()


def users_frame(file: pl.Expr, kind: pl.Expr, user_code: tuple[str, ...] = ()) -> pl.Expr:
    """Whether a frame is in the user's code (a Python frame of a file not in
    LIBRARY_FILES, or under one of ``user_code`` when given)."""
    python = kind.cast(pl.String) == "python"
    if user_code:
        mine = pl.lit(False)
        for root in user_code:
            mine = mine | (file == root) | file.str.starts_with(root if root == "/" else root + "/")
        return python & mine.fill_null(False)
    return python & file.is_not_null() & ~file.str.contains(LIBRARY_FILES)


def site_depth(cap: Capture) -> pl.LazyFrame:
    """(pid, stack_id) -> site_depth: the depth of the frame that names the
    stack's call site under the capture's policy (0: the innermost)."""
    pol = policy(cap)
    if pol.mode == "innermost":
        return cap.stacks.select("pid", "stack_id").unique().with_columns(pl.lit(0, pl.UInt16).alias("site_depth"))
    user = users_frame(pl.col("file"), pl.col("kind"), pol.user_code)
    return cap.stacks.group_by("pid", "stack_id").agg(
        pl.col("depth").filter(user).min().fill_null(0).cast(pl.UInt16).alias("site_depth"))


def sites(cap: Capture) -> pl.LazyFrame:
    """(pid, stack_id) -> call_site "file:line function", from each stack's
    site frame (`site_depth`)."""
    return cap.stacks.join(site_depth(cap), on=["pid", "stack_id"]).filter(
        pl.col("depth") == pl.col("site_depth")).select(
        "pid", "stack_id",
        pl.format("{}:{} {}", pl.col("file").fill_null("?"), pl.col("line").cast(pl.String).fill_null("?"),
                  pl.col("function").fill_null("?")).alias("call_site"),
    ).unique(["pid", "stack_id"])


def with_site(frame: pl.LazyFrame, cap: Capture, no_stack: str | None = NO_STACK) -> pl.LazyFrame:
    """``frame`` (with pid and stack_id) plus its call_site column; calls
    without a stack get ``no_stack`` (None: null)."""
    out = frame.join(sites(cap), on=["pid", "stack_id"], how="left")
    return out if no_stack is None else out.with_columns(pl.col("call_site").fill_null(no_stack))


def top_site(frame: pl.LazyFrame, keys: list[str], *weights: pl.Expr) -> pl.LazyFrame:
    """keys + top_call_site: per group of ``frame`` (with a call_site column,
    null for calls without a stack), the site with the largest ``weights``
    (aggregations, compared in order; ties to the first site by name).  A
    group none of whose calls has a stack is absent: join it back with
    how="left" and it reads null."""
    named = [w.alias(f"_w{i}") for i, w in enumerate(weights)]
    order = [pl.col(f"_w{i}") for i in range(len(weights))]
    return (
        frame.filter(pl.col("call_site").is_not_null())
        .group_by(*keys, "call_site").agg(*named)
        .with_columns(pl.col("call_site").cast(pl.String))  # ties go to the first by name, not by category
        .group_by(keys).agg(
            pl.col("call_site").sort_by([*order, pl.col("call_site")], descending=[*(True,) * len(order), False],
                                        nulls_last=True).first().alias("top_call_site"))
    )


def with_top_site(result: pl.LazyFrame, calls: pl.LazyFrame, keys: list[str], *weights: pl.Expr) -> pl.LazyFrame:
    """``result`` (one row per ``keys``) plus the top_call_site of its ``calls``
    (`top_site`).  Keys may be null (a sync with no stream): nulls match."""
    return result.join(top_site(calls, keys, *weights), on=keys, how="left", nulls_equal=True,
                       maintain_order="left")


def with_launch_site(frame: pl.LazyFrame, cap: Capture) -> pl.LazyFrame:
    """``frame`` (launches: pid, launch_seq, as the merge numbers them) plus
    the call_site of each (Categorical; null: no stack), gathered from the
    launch's row of launch_order (merge.order_position), not joined on
    (pid, launch_seq) across millions of launches."""
    key = ("launch_sites",)
    if key not in cap.cache:
        cap.cache[key] = (
            merge.launch_order(cap).lazy().select("pid", "stack_id")
            .join(sites(cap).with_columns(pl.col("call_site").cast(pl.Categorical)), on=["pid", "stack_id"],
                  how="left", maintain_order="left")
            .collect()["call_site"]
        )
    at = merge.order_position(merge.launch_order(cap), pl.col("pid"), pl.col("launch_seq"))
    return frame.with_columns(pl.lit(cap.cache[key]).gather(at).alias("call_site"))


def allocation_sites(cap: Capture, device_only: bool = True) -> pl.LazyFrame:
    """Allocation instances (device memory only, unless ``device_only`` is
    False: pinned host memory too) with the line of the call that made them
    (same process, thread and entry time as its event; null call_site: no
    stack, or a device-module record)."""
    calls = cap.events.filter(pl.col("kind") == "alloc").select(
        "pid", "tid", pl.col("ts_ns").alias("alloc_ts_ns"), "stack_id").unique(["pid", "tid", "alloc_ts_ns"], keep="first")
    allocs = merge.allocations(cap).filter(lifetimes.holds_memory())  # a VMM mapping's bytes are its memory's
    if device_only:
        allocs = allocs.filter(pl.col("kind") != "host")
    return with_site(allocs.join(calls, on=["pid", "tid", "alloc_ts_ns"], how="left"), cap, None)
