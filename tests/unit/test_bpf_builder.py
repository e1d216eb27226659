"""One BPF program builder (probes.program.build) for every program loaded: each
capture mode, the discover program alone, --print-bpf.  The texts it gives are
the ones the four builders it replaced gave (probes.program.build_bpf_text,
capture.procs.late_load.discover_text, capture.bpf.probe_set.program_text,
capture.session.dry_run.bpf_text): the sha256 of each was taken from those
before they went.  The hashes cover how the text is put together (order,
configuration, generated lines); the bpf/ files and the schema header stand in
by name, and the kernel's struct offsets by N, so that editing a BPF source or
running on another kernel does not change them.  A deliberate change of the
text's assembly changes a hash: update it with the change."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pasta_trace import cli, schema
from pasta_trace.capture.bpf.probe_set import program_spec
from pasta_trace.capture.session import dry_run
from pasta_trace.probes import catalog, program

pytestmark = pytest.mark.skipif(not program.VMLINUX_BTF.exists(), reason="the kernel has no BTF")

BY = {a.symbol: a for a in catalog.APIS}

#: name -> (how the text is built now, sha256 of the old code path's normalized text)
CAPTURES = {
    "pid": (dict(buffer_pages=1024, aggregate=False, filter_pids=True),
            "fc4d2c7658ef15ad9de80cfbadadc4ca713a8dd65bbcbf092660541951e41da7"),
    "system": (dict(buffer_pages=1024, aggregate=False, filter_pids=False),
               "ffb94c64f45ca9d5cde391da3213563537e7c19877ec73694ee2ee8d07c142bc"),
    "aggregate": (dict(buffer_pages=4096, aggregate=True, filter_pids=True, aggregate_max=4),
                  "1755be14b9e79e592ce9a5a93432482d698c4e36e8154a54e503f823ce46a1f0"),
    "stacks": (dict(buffer_pages=1024, aggregate=False, filter_pids=True, stack_depth=32, stack_pages=128),
               "5f5910a0485b6dc3fbbf357bce5548c6f4de1aaec70e6002de0104e1074c3b80"),
    "native_default": (dict(buffer_pages=1024, aggregate=False, filter_pids=False, native_stacks="default",
                            native_pages=512),
                       "0f34fa04e4469545d2b92f569b296f45c8f85e0735641c003aeae95a41c5f645"),
    "native_all_stacks": (dict(buffer_pages=65536, aggregate=False, filter_pids=True, stack_depth=8,
                               native_stacks="all"),
                          "bc18cf2336f311d413bfd3f8632394cd2af2b07fcd87da8f5bf97fc562805009"),
    "uid": (dict(buffer_pages=1024, aggregate=False, filter_pids=True, allowed_uid=1000),
            "80382e872ddc9a1c58a51c1b03890831baa391a66d04da202ee50a947648af7f"),
}
#: probes.program.Spec -> sha256, for the texts built without a capture's settings
SPECS = {
    "capture_floor": (replace(program_spec(buffer_pages=1024, aggregate=False, filter_pids=True), apis=()),
                      "d668f584c8c06792d241ee5046430d339da2ff1a1368908db9574bb51b19fd04"),
    "probes_default": (program.Spec(discover=False),
                       "6b99362b90be0e7361ed51f6d650d872ce27247060a0ae0f239468f6345b1f07"),
    "probes_small": (program.Spec(discover=False, ring_pages=64, names_pages=16,
                                  apis=(BY["cuLaunchKernel"], BY["cudaMalloc"], BY["hipMalloc"])),
                     "5fb270d5fd0159b4f460407002a3cb0f6b9536713c6c138c337d639b3700b6b1"),
    "probes_agg_filter": (program.Spec(discover=False, aggregate=True, filter_pids=True),
                          "56b3cf57546e5064f59d3f8c0109fe411a7b2125d38785b47b387c3837e90ffa"),
    "probes_with_discover": (program.Spec(ring_pages=256, filter_pids=True),
                             "cbdcfc9e6637673513647ee3db2f4a21c6da9c7661eff908c2103abee42de5c1"),
    "discover_alone_pid": (program.Spec(probes=False, filter_pids=True),
                           "651b169876572e025ebaca6053602682a30ab1f7af58f0b96411d93ad6504894"),
    "discover_alone_system": (program.Spec(probes=False, filter_pids=False),
                              "8051d6420a69e44a7d841073aebc0f6156808c61ecbd6442c627bb4e2d888078"),
    "discover_alone_known": (program.Spec(probes=False, filter_pids=True, known_max=4),
                             "08567909b584b3f31f0ef1054dcf59802c6b2eda21ab3d54c65ca1106cf29c4e"),
}
#: `pasta-trace record` arguments -> sha256 of what --print-bpf writes
PRINTED = {
    "print_bpf": (["--print-bpf"], "f8c4e6e02d1c61632e64f266e157b98b96942c701a12016769d58ddb737263ac"),
    "print_bpf_system": (["--print-bpf", "-a", "--no-stacks"],
                         "6de3c60cd534301f766df416cbb0137094e279b7db7b628cd3a25d54066bf4be"),
    "print_bpf_agg": (["--print-bpf", "--aggregate"],
                      "8ae96a77af005b5b25eafcdb05eb174a28a43c99077b7688857d96b4628f4f1e"),
    "print_bpf_native": (["--print-bpf", "--native-stacks", "all", "-p", "1"],
                         "41884f521dcc2a423665b359ec48e02af0240b31f306472f5678fb954e73d93a"),
}


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    """No test limits on the maps, and no sudo user (who would restrict the program to their uid)."""
    for name in list(os.environ):
        if name.startswith(("PASTA_TRACE_TEST_", "SUDO_")):
            monkeypatch.delenv(name)


def normalized_sha(text: str) -> str:
    pieces = [(f"<{p.name}>", p.read_text()) for p in sorted(Path(program.BPF_DIR).glob("*.[ch]"))]
    pieces.append(("<header>", schema.bpf_c_header()))
    for name, piece in sorted(pieces, key=lambda p: -len(p[1])):
        text = text.replace(piece, name)
    text = re.sub(r"(?m)^(#define (?:PT_TASK_COMM_OFF|PT_OFF_\w+)) \d+$", r"\1 N", text)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("name", CAPTURES)
def test_each_capture_mode_gets_the_text_it_got_before(name):
    kw, sha = CAPTURES[name]
    assert normalized_sha(program.build(program_spec(**kw))) == sha


@pytest.mark.parametrize("name", SPECS)
def test_each_spec_gets_the_text_it_got_before(name):
    spec, sha = SPECS[name]
    assert normalized_sha(program.build(spec)) == sha


@pytest.mark.parametrize("name", PRINTED)
def test_print_bpf_prints_the_text_it_printed_before(name):
    argv, sha = PRINTED[name]
    assert normalized_sha(dry_run.bpf_text(cli.build_parser().parse_args(["record", *argv]))) == sha


def test_print_bpf_is_the_capture_text_of_its_mode():
    args = cli.build_parser().parse_args(["record", "--print-bpf", "-a", "--no-stacks"])
    assert dry_run.bpf_text(args) == program.build(program_spec(
        buffer_pages=args.buffer_pages, aggregate=False, filter_pids=False, stack_pages=args.stack_buffer_pages,
        native_stacks=args.native_stacks, native_pages=args.native_stack_buffer_pages))


def test_the_discover_program_alone_declares_its_own_pid_filter():
    alone = program.build(program.Spec(probes=False, filter_pids=True))
    joined = program.build(program.Spec(filter_pids=True))
    assert alone.startswith(schema.bpf_c_header())
    assert alone.count("BPF_HASH(pid_filter, u32, u8, 65536);") == 1
    assert "BPF_HASH(pid_filter, u32, u8, 65536);" not in joined
    assert joined.endswith(alone.removeprefix(schema.bpf_c_header()).replace(
        "#define PT_DISCOVER_ALONE 1\nBPF_HASH(pid_filter, u32, u8, 65536);\n", ""))


def test_a_spec_with_no_program_is_refused():
    with pytest.raises(ValueError, match="the probes, the discover program or both"):
        program.build(program.Spec(probes=False, discover=False))
