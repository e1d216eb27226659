"""Probes: what is probed and how the probes are put in place.  The table of
every probed entry point (catalog), the BPF program text built from it and
bpf/*.bpf.c (program: one builder for every program loaded), the vendor
struct offsets it reads (offsets) and the running kernel's (kernel_offsets,
through libbpf), where in a function a uprobe goes (placement), the symbols
and fatbin kernel names of a library (elf, fatbin), the attach itself as
uprobe_multi links (attach, uprobe_link), libraries held open while probed
(pinned) and the compiled handlers kept between captures (compiled_cache).
Nothing here knows about a capture session; capture/ uses it."""
