"""Packaging for mnpar; see README.rst for how to install and use it."""
from setuptools import find_packages, setup

setup(
    name="mnpar",
    version="0.1.0",
    description="Model-parallel training for Chainer on MPI, ChainerMN-compatible",
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    packages=find_packages(include=["mnpar", "mnpar.*"]),
    python_requires=">=3.9",
    install_requires=[
        "chainer==7.8.1",
        "numpy<2",
        "setuptools<74",
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
