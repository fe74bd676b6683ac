"""Packaging for mnpar; see README.rst for how to install and use it.

Besides the packages, an install puts ``mnpar-compat.pth`` into site-packages:
it runs mnpar's start-up hooks (``_mnpar_compat``) in every interpreter of the
environment. A wheel gets it from ``build_py``; an editable install
(``pip install -e .``) from ``editable_wheel``, which builds no ``build_lib``.
"""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

START_UP = "mnpar-compat.pth"


class BuildPyWithStartUp(build_py):
    def run(self):
        super().run()
        self.copy_file(START_UP, os.path.join(self.build_lib, START_UP))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, START_UP)]


commands = {"build_py": BuildPyWithStartUp}
try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64 installs editables with develop: no start-up hook
    pass
else:
    class EditableWheelWithStartUp(editable_wheel):
        # The one step (setuptools 64-73) that writes files into the editable
        # wheel's root, which becomes site-packages.
        def _install_namespaces(self, installation_dir, *args):
            super()._install_namespaces(installation_dir, *args)
            self.copy_file(START_UP, os.path.join(installation_dir, START_UP))

    commands["editable_wheel"] = EditableWheelWithStartUp

setup(
    name="mnpar",
    version="0.1.0",
    description="Model-parallel training for Chainer on MPI, ChainerMN-compatible",
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    packages=find_packages(include=["mnpar", "mnpar.*", "_mnpar_compat"]),
    cmdclass=commands,
    python_requires=">=3.9",
    install_requires=[
        "chainer==7.8.1",
        # numpy 2 and Python 3.12+ through _mnpar_compat.
        "numpy>=1.21",
        # chainer imports pkg_resources at start.
        "setuptools<80",
        "mpi4py>=3.1",
        "threadpoolctl>=3",
    ],
    extras_require={
        # libmpi and mpiexec from PyPI; leave this out to use a system MPI.
        "mpich": ["mpich"],
        "examples": ["scikit-learn", "matplotlib", "nltk"],
        "dev": ["pytest", "pytest-timeout", "ruff", "mypy", "sphinx"],
    },
)
