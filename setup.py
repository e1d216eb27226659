"""Build hook: the wheel carries bpf/ as pasta_trace/bpf, so an installed
package (not only a source checkout) finds the BPF sources it compiles at run
time.  bpf/ stays at the top of the tree, beside gpu_probes/, where the C lives."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BPF_SOURCES = Path(__file__).resolve().parent / "bpf"


class BuildPyWithBpf(build_py):
    def run(self) -> None:
        super().run()
        dest = Path(self.build_lib) / "pasta_trace" / "bpf"
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted(BPF_SOURCES.glob("*.[ch]")):
            shutil.copyfile(src, dest / src.name)


setup(cmdclass={"build_py": BuildPyWithBpf})
