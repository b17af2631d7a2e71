"""Moved to converters (source.py: the reader contract; folder.py; registry.py); kept until
the imports move."""
from converters.folder import FolderSource  # noqa: F401
from converters.registry import MANIFEST, detect as detect_format  # noqa: F401
from converters.registry import open_source, resolve as resolve_format  # noqa: F401
from converters.source import IMG_EXTENSIONS, MemorySource, SampleError, SampleSource  # noqa: F401

FORMATS = ("auto", "folder", "lmdb", "wds")
