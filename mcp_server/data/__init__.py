"""Data files ccw reads at run time, shipped inside the distribution.

Where they live: the readable copies stay at the top of the repository (``policies/``,
``deploy/``), where people browsing the tree look for them; this package holds a symlink
to each.  In a checkout (and in an editable install) the symlinks lead back to those
directories; building a wheel or an sdist copies the files through the symlinks (setuptools
reads package data by path), so an installed ccw carries real files here and needs no
checkout.  Everything reads them through ``importlib.resources`` via ``data_dir``, so
there is one way to find them wherever ccw is installed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sandbox.errors import CcwError

SHIPPED = ("policies", "deploy")  # the data directories a distribution of ccw carries


def data_dir(name: str) -> Path:
    """The directory of shipped data ``name`` (one of ``SHIPPED``) as a filesystem path.

    A path, not a ``Traversable``: the schema catalogue walks it and gives its files
    ``file://`` URIs.  pip, pipx and uv always unpack wheels onto the filesystem; a
    zipped install (zipimport) is not supported and says so.
    """
    if name not in SHIPPED:
        raise ValueError(f"unknown data directory {name!r}; shipped: {', '.join(SHIPPED)}")
    found = resources.files(__name__).joinpath(name)
    if not isinstance(found, Path) or not found.is_dir():
        raise CcwError(
            "UNAVAILABLE",
            f"ccw's data directory {name!r} is missing from this installation ({found}); "
            "reinstall ccw from a wheel or sdist (pip install --force-reinstall ccw), or run from a checkout",
            {"data_dir": str(found)},
        )
    return found
