"""`python -m pasta_trace.schema`: print or regenerate the C headers."""

from __future__ import annotations

from .c_headers import DEVICE_HEADER_PATH
from .c_headers import bpf_c_header
from .c_headers import device_c_header


def main(argv: list[str] | None = None) -> int:
    import argparse
    import pathlib

    ap = argparse.ArgumentParser(prog="python -m pasta_trace.schema", description="Print or regenerate the C headers of the records.")
    ap.add_argument("--bpf", action="store_true", help="print the BPF C header")
    ap.add_argument("--device", action="store_true", help="print the device C header")
    ap.add_argument("--write", action="store_true", help=f"regenerate {DEVICE_HEADER_PATH}")
    a = ap.parse_args(argv)
    if a.write:
        root = pathlib.Path(__file__).resolve().parents[2]
        p = root / DEVICE_HEADER_PATH
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(device_c_header())
        print(f"Wrote {p}")
    if a.bpf:
        print(bpf_c_header())
    if a.device:
        print(device_c_header())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
