"""Folder put first on PYTHONPATH by DeviceSession("cupti"): its sitecustomize starts the collector."""
