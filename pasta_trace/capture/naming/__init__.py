"""Names for what the probes see as handles: kernel names of launch handles at attach (attach_names,
name_scan), host stubs' symbols (stub_names, symbolize), one launch seen at two layers (pairing) and the
build-ids that tie offline naming to the files the process ran."""
