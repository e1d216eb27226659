"""The BPF runtime of a capture: loading and attaching the probes program (probe_set), its rings read by
mapping their memory (ringbuf), its maps by name or file descriptor (bpf_maps, map_fds) and the kernel's
struct offsets the programs read (kernel_offsets).  The uprobe links themselves are probes.uprobe_link,
a layer below, which probes.attach uses too."""
