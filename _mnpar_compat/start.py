"""Importing this module installs the start-up hooks: ``mnpar-compat.pth`` and ``mnpar`` do."""
from . import install

install()
