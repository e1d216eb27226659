"""One text form for handles and addresses everywhere (exports, CSV, names
like unknown@0x...): "0x" and lower-case hex digits, no padding."""

from __future__ import annotations

import polars as pl

_DIGITS = "0123456789abcdef"


def hex_expr(x: pl.Expr) -> pl.Expr:
    """0x-prefixed lower-case hex of an unsigned integer column, null where
    it is null.  Polars has no integer -> hex formatter, so each nibble's
    digit is picked out of a 16-character string, column-wise."""
    x = x.cast(pl.UInt64)
    digits = pl.lit(_DIGITS)
    nibbles = [digits.str.slice(((x // 16**i) % 16).cast(pl.Int64), 1) for i in range(15, -1, -1)]
    return pl.concat_str([pl.lit("0x"), pl.concat_str(nibbles).str.strip_chars_start("0").replace("", "0")])


def hex_series(s: pl.Series, prefix: str = "") -> pl.Series:
    """`prefix` + hex_expr of each value, formatted once per distinct value
    (handles repeat: a few streams serve millions of launches)."""
    uniq = s.unique().drop_nulls().to_frame("v")
    table = uniq.with_columns(h=pl.lit(prefix) + hex_expr(pl.col("v")))
    return s.to_frame("v").join(table, on="v", how="left", maintain_order="left")["h"]
