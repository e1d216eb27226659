"""pasta-trace: trace CUDA and HIP activity of running GPU programs."""
__version__ = "0.1.0"
