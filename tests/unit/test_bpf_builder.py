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
            "caafd877ecd2bcfc714583b2a251773ddea0f44fd3653156ee713b4eeb87d704"),
    "system": (dict(buffer_pages=1024, aggregate=False, filter_pids=False),
               "601befafd15592d2ffb6c5faf051ee3dc73b6aafa462486c5d6a01fa65b32c16"),
    "aggregate": (dict(buffer_pages=4096, aggregate=True, filter_pids=True, aggregate_max=4),
                  "eb9327690c174d10d81d5b5a0a03c8dc7cae7993a7cfbc9c3db280e0eab3676a"),
    "stacks": (dict(buffer_pages=1024, aggregate=False, filter_pids=True, stack_depth=32, stack_pages=128),
               "0ca4eb98e65eac7ed76c6f10e5430bcb663f955c19412f825500ad0345136a4b"),
    "native_default": (dict(buffer_pages=1024, aggregate=False, filter_pids=False, native_stacks="default",
                            native_pages=512),
                       "8b2a6fd692a22a55d643c1b454ea4da5312878526cead285e96df36a02ca138f"),
    "native_all_stacks": (dict(buffer_pages=65536, aggregate=False, filter_pids=True, stack_depth=8,
                               native_stacks="all"),
                          "2bdd379be62f83c5416e1c58cfc05720f317c4f3e4eaf47c6bf2d4c4c813601f"),
    "uid": (dict(buffer_pages=1024, aggregate=False, filter_pids=True, allowed_uid=1000),
            "761d261a2776d5b6041184d2eab7dc71af67dfb9fc541aa3d17f0cd9c294b532"),
}
#: probes.program.Spec -> sha256, for the texts built without a capture's settings
SPECS = {
    "capture_floor": (replace(program_spec(buffer_pages=1024, aggregate=False, filter_pids=True), apis=()),
                      "0d8b1f770b9335a397a4294fd4803c310f3892b62e30afe228c8a440033a4b81"),
    "probes_default": (program.Spec(discover=False),
                       "6b99362b90be0e7361ed51f6d650d872ce27247060a0ae0f239468f6345b1f07"),
    "probes_small": (program.Spec(discover=False, ring_pages=64, names_pages=16,
                                  apis=(BY["cuLaunchKernel"], BY["cudaMalloc"], BY["hipMalloc"])),
                     "5fb270d5fd0159b4f460407002a3cb0f6b9536713c6c138c337d639b3700b6b1"),
    "probes_agg_filter": (program.Spec(discover=False, aggregate=True, filter_pids=True),
                          "56b3cf57546e5064f59d3f8c0109fe411a7b2125d38785b47b387c3837e90ffa"),
    "probes_with_discover": (program.Spec(ring_pages=256, filter_pids=True),
                             "f2c593675194c31c37919c04390f9aeb3182fa2e6b972abb85e03e7566376251"),
    "discover_alone_pid": (program.Spec(probes=False, filter_pids=True),
                           "c55985cffd757e8384bed6229ccfca852fdafd6590cd8d2bfdce21a602755188"),
    "discover_alone_system": (program.Spec(probes=False, filter_pids=False),
                              "ae0a6d09800cbe15c43d1cc5621476ee19398895f62c976672c7da547e708ea9"),
    "discover_alone_known": (program.Spec(probes=False, filter_pids=True, known_max=4),
                             "cae92bf58dda9cbc7bd1ac2e7b081866956a25bcb2a74b6c14da2471dd63141c"),
}
#: `pasta-trace record` arguments -> sha256 of what --print-bpf writes
PRINTED = {
    "print_bpf": (["--print-bpf"], "aebb5eee941074a3e5327a87de9a9d51d5ed8e249d963e90780339bf9b3e6fbe"),
    "print_bpf_system": (["--print-bpf", "-a", "--no-stacks"],
                         "e7d1c06f25dc40f10da14f8d4fb4ac52a52a0f05945f35f2b9942baad10e0a63"),
    "print_bpf_agg": (["--print-bpf", "--aggregate"],
                      "6808e2b9aa098603b4a6fa4e8ae2032c743b2884f7ebf7163d1e81f2ac4c4a71"),
    "print_bpf_native": (["--print-bpf", "--native-stacks", "all", "-p", "1"],
                         "3cc696304a2361108d0b244ae9d922b06fcc06a574a919e5b95f4842524f8dc6"),
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
