"""JupyterLab server side of `make lab`: open the labs without marking them modified.

When a notebook's kernel connects, JupyterLab writes the kernel's ``language_info`` into the
notebook's metadata; if that differs from what is stored, the notebook is marked modified
and the student is asked to save changes they did not make. The labs store what JupyterLab
writes, but ``language_info.version`` is the Python version of the kernel (``3.11.7``,
``3.12.3``, ...), which differs between machines. This contents manager hands a lab to
JupyterLab with the version of this Python, the one the server starts its kernel with; the
file on disk is not touched. `make lab` starts JupyterLab with::

    --ServerApp.contents_manager_class=parlab.labserver.LabsContentsManager
"""
from __future__ import annotations

import sys

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


def with_this_python(notebook) -> None:
    """Set a Python notebook's metadata.language_info.version to this interpreter's, in place."""
    info = notebook.get("metadata", {}).get("language_info")
    if isinstance(info, dict) and info.get("name") == "python" and "version" in info:
        info["version"] = sys.version.split()[0]   # as ipykernel reports it


class LabsContentsManager(AsyncLargeFileManager):
    """JupyterLab's default contents manager; notebooks are read with this Python's version."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and model.get("content"):
            with_this_python(model["content"])
        return model
