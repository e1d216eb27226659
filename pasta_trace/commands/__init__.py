"""One module per CLI verb.  Each exposes:

    HELP: str                       one-line summary for `pasta-trace -h`
    EXAMPLES: str                   appended to the verb's --help
    add_arguments(parser) -> None
    run(args) -> int                exit code; raise errors.PastaError for user errors

`cli.py` only parses and dispatches; no logic lives there.  What several
verbs share is in common.py (a verb never imports another verb), the argparse
types of their values in arg_types.py.
"""

#: verb -> module name under pasta_trace.commands; `record` is the default verb.
VERBS = {
    "record": "record",
    "top": "top",
    "daemon": "daemon",
    "dump": "dump",
    "doctor": "doctor",
    "merge": "merge",
    "report": "report",
    "export": "export",
}
