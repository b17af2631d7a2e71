"""Moved to converters.wds.tarfmt; kept until the imports move."""
from converters.wds.tarfmt import *  # noqa: F401,F403
from converters.wds.tarfmt import member_header  # noqa: F401
