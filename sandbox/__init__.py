"""ccw-helper: the privileged half of ccw. It does kernel work only (overlayfs, namespaces,
cgroups, fanotify) behind a closed set of IPC operations; see ARCHITECTURE.md, "Decisions"."""

__version__ = "0.1.0"  # the distribution's version (pyproject.toml reads it from here)
