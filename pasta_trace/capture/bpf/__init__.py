"""The BPF runtime of a capture: loading and attaching the probes program (probe_set), its rings read by
mapping their memory (ringbuf) and its maps by name or file descriptor (bpf_maps, map_fds).  The program
text is probes.program's (probe_set.program_spec gives it a capture's settings); the uprobe links are
probes.uprobe_link and the kernel's struct offsets probes.kernel_offsets, a layer below, which
probes.attach and probes.program use too."""
