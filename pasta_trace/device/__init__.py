"""Device side in Python: read device record files into frames, write them, collect CUPTI records,
and set up a device backend for a launched command.

``read_device_files(paths) -> DeviceData`` is what :mod:`pasta_trace.read` calls.
"""

from .reader import FILES_SCHEMA, DeviceData, read_device_file, read_device_files

__all__ = ["DeviceData", "FILES_SCHEMA", "read_device_file", "read_device_files"]
