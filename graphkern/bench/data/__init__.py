"""Built-in benchmark data (see README.md here)."""

from importlib import resources


def molecules_path():
    """Path of the packaged molecule set: 1000 NCI molecules, 3D coordinates, RDKit properties."""
    return str(resources.files(__name__).joinpath("nci1000.sdf.gz"))
