"""Markdown of a transcript's messages as HTML the console can put on its page.

Model text is hostile input. Three layers keep it text: markdown-it never passes HTML through (``html``
off: a tag is shown as the characters it is); a link is made only of an absolute ``http``, ``https`` or
``mailto`` URL (anything else stays the text it was, however it is spelled or encoded); and the output goes
through nh3 with an allow-list of the tags, attributes and classes this module itself writes, so even a
renderer mistake cannot put a script, an event handler, a style or a frame on the page.

A Markdown image is never loaded (a remote address would tell its owner who reads the transcript and when): it
becomes a link to the picture. Headings start at ``h4`` (the page's own go down to ``h3``, a tool card's is
``h4``). Fenced code is highlighted by Pygments when its info string names a language it knows (class names
only; the colours are in console.css), else shown as escaped text; every block has a copy button, hidden
until console.js runs.

Bounded work: a text is cut at ``SOURCE_LIMIT`` characters with a note; block nesting deeper than
``NESTING_LIMIT`` (quotes in quotes, lists in lists) is shown as the text it is instead of nested further.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

SOURCE_LIMIT = 60_000
# markdown-it's own limit (it drops what lies deeper); the console's rule shows it as text a little before.
PARSER_NESTING_LIMIT = 40
NESTING_LIMIT = PARSER_NESTING_LIMIT - 4
LINK_SCHEMES = ("http://", "https://", "mailto:")
LINK_REL = "noopener noreferrer nofollow"
# The page's headings go down to h3 (a message's role) and h4 (a tool card): a message's start at h4.
HEADING_TAGS = {"h1": "h4", "h2": "h5", "h3": "h6", "h4": "h6", "h5": "h6", "h6": "h6"}
ALIGN_CLASSES = {
    "text-align:left": "align-left",
    "text-align:center": "align-center",
    "text-align:right": "align-right",
}
LANGUAGE_NAME = re.compile(r"[A-Za-z0-9_+#.-]{1,40}")
ID_CHARACTERS = re.compile(r"[^A-Za-z0-9_-]")
RENDER_CACHE_SIZE = 512

# What this module's renderer writes, and nothing else.
ALLOWED_TAGS = "p br em strong s code pre blockquote ul ol li a hr h4 h5 h6 table thead tbody tr th td div span button"

_CODE_FORMATTER = HtmlFormatter(nowrap=True)
_TOKEN_CLASSES = {name for name in STANDARD_TYPES.values() if name}

_CLEANER = nh3.Cleaner(
    tags=set(ALLOWED_TAGS.split()),
    clean_content_tags={"script", "style"},
    attributes={
        "a": {"href", "title"},
        "ol": {"start"},
        "pre": {"id"},
        "button": {"data-copy-from", "hidden"},
    },
    # A button is never a form's submit button.
    set_tag_attribute_values={"button": {"type": "button"}},
    allowed_classes={
        "div": {"code-block", "code-head", "md-cut"},
        "span": _TOKEN_CLASSES | {"code-lang"},
        "code": {"highlight"},
        "button": {"copy"},
        "th": set(ALIGN_CLASSES.values()),
        "td": set(ALIGN_CLASSES.values()),
    },
    strip_comments=True,
    link_rel=LINK_REL,
    url_schemes={"http", "https", "mailto"},
    url_relative="deny",
)


def render(text: str, block_id: str = "md") -> str:
    """``text`` (Markdown) as sanitised HTML. ``block_id``: unique on the page; the ids of the code blocks (which
    their copy buttons name) start with it."""
    # Cut before the cache: its keys hold at most SOURCE_LIMIT characters each, not a megabyte of model output.
    return _render(text[:SOURCE_LIMIT], len(text), ID_CHARACTERS.sub("-", block_id) or "md")


@lru_cache(maxsize=RENDER_CACHE_SIZE)
def _render(text: str, full_length: int, block_id: str) -> str:
    # The page is drawn anew on every live update: a message already drawn costs a lookup.
    note = ""
    if full_length > SOURCE_LIMIT:
        note = f'<div class="md-cut">… cut: the first {SOURCE_LIMIT:,} of {full_length:,} characters are shown.</div>'
    env: dict[str, Any] = {"block_id": block_id, "code_blocks": 0}
    tokens = _PARSER.parse(text, env)
    _adjust(tokens)
    return sanitise(_PARSER.renderer.render(tokens, _PARSER.options, env) + note)


def sanitise(html: str) -> str:
    """``html`` with only the tags, attributes, classes and link schemes this module's renderer writes."""
    return _CLEANER.clean(html)


def _link_allowed(url: str) -> bool:
    # markdown-it hands over the destination with entities decoded and the URL normalised (percent-encoded), so
    # "JaVaScRiPt:", "&#106;avascript:" or "java\tscript:" reach this as what they are: not in the list.
    return url.strip().lower().startswith(LINK_SCHEMES)


def _adjust(tokens: list[Token]) -> None:
    """Headings demoted below the page's own; a table cell's alignment as a class, not a style attribute."""
    for token in tokens:
        if token.type in ("heading_open", "heading_close"):
            token.tag = HEADING_TAGS.get(token.tag, "h6")
        elif token.type in ("th_open", "td_open"):
            style = str(token.attrs.pop("style", "")).replace(" ", "")
            if style in ALIGN_CLASSES:
                token.attrSet("class", ALIGN_CLASSES[style])


def _too_deep(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
    """Below ``NESTING_LIMIT`` the rest of the block is one paragraph of its text (markdown-it itself would drop
    it at its own limit, and each level costs a recursion)."""
    if state.level < NESTING_LIMIT:
        return False
    if silent:
        return True
    line = start_line
    while line < end_line and (state.isEmpty(line) or state.sCount[line] >= state.blkIndent):
        line += 1
    state.push("paragraph_open", "p", 1).map = [start_line, line]
    inline = state.push("inline", "", 0)
    inline.content = state.getLines(start_line, line, state.blkIndent, False).strip()
    inline.map = [start_line, line]
    inline.children = []
    state.push("paragraph_close", "p", -1)
    state.line = line
    return True


def _fence(self: Any, tokens: list[Token], index: int, options: OptionsDict, env: EnvType) -> str:
    token = tokens[index]
    env["code_blocks"] += 1
    code_id = f"{env['block_id']}-code-{env['code_blocks']}"
    words = token.info.strip().split()
    language = words[0] if words and LANGUAGE_NAME.fullmatch(words[0]) else ""
    body = _highlighted(token.content, language)
    label = f'<span class="code-lang">{_escape(language)}</span>' if language else ""
    return (
        f'<div class="code-block"><div class="code-head">{label}'
        f'<button type="button" class="copy" data-copy-from="{code_id}" hidden>Copy</button></div>'
        f'<pre id="{code_id}"><code class="highlight">{body}</code></pre></div>\n'
    )


def _highlighted(code: str, language: str) -> str:
    if language:
        try:
            lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
        except ClassNotFound:
            pass
        else:
            return highlight(code, lexer, _CODE_FORMATTER)
    return _escape(code)


def _image(self: Any, tokens: list[Token], index: int, options: OptionsDict, env: EnvType) -> str:
    """A link to the picture, never the picture (no request leaves the page for it)."""
    token = tokens[index]
    alt = self.renderInlineAsText(token.children or [], options, env) or "image"
    source = str(token.attrGet("src") or "")
    if not source:
        return _escape(f"[image: {alt}]")
    return f'<a href="{_escape(source)}">{_escape(f"image: {alt}")}</a>'


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _parser() -> MarkdownIt:
    parser = MarkdownIt(
        "commonmark", {"html": False, "breaks": True, "linkify": False, "maxNesting": PARSER_NESTING_LIMIT}
    ).enable(["table", "strikethrough"])
    parser.validateLink = _link_allowed  # type: ignore[method-assign]
    parser.block.ruler.before("table", "too_deep", _too_deep)
    parser.add_render_rule("fence", _fence)
    parser.add_render_rule("code_block", _fence)
    parser.add_render_rule("image", _image)
    return parser


_PARSER = _parser()
