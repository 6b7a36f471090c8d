"""Escaping text for HTML and SVG.
"""

import html

from ..journal.values import as_str


def esc(s):
    return html.escape(as_str(s, ""), quote=True)
