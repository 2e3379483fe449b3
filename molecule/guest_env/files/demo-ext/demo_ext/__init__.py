import json

from ._buildinfo import BUILD as _BUILD
from ._native import answer

BUILD = json.loads(_BUILD)
__all__ = ["BUILD", "answer"]
