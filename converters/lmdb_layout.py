"""Moved to converters.lmdb.layout; kept until the imports move."""
from converters.lmdb.layout import *  # noqa: F401,F403
from converters.lmdb.layout import HEADER, decode_value, index_dtype, key  # noqa: F401
