"""The C CUPTI injection set up by pasta_trace.device.inject around a PyTorch MLP: argv DIR (the device
files' directory), PYTHON (an interpreter with PyTorch), MLP (torch_mlp.py); prints its exit status, the
CUPTI kernel records and whether each ends after it starts.

Run by scripts/gpu_check."""
import os, sys, subprocess
from pasta_trace.device.inject import DeviceSession
s = DeviceSession('cupti', sys.argv[1])
rc = subprocess.run([sys.argv[2], sys.argv[3], '5'], env={**os.environ, **s.env()}).returncode
files = s.finish()
from pasta_trace.device import read_device_files
k = read_device_files(files).frames['cupti_kernels']
print('rc', rc, 'kernels', k.height, 'ordered', int((k['end'] >= k['start']).all() if k.height else 0))
