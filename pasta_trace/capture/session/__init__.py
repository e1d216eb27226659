"""One capture from start to `Wrote DIR`: what it is asked (options), the checks before it, the session
that loads, attaches and drains, its end (finish, summary), the dry run and what `top` counts."""
