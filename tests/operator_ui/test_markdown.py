"""The transcript's Markdown (operator_ui/markdown.py): what a model writes is drawn as lists, emphasis, links,
tables, quotes, demoted headings and highlighted code with a copy button, and what a hostile model writes —
HTML of any kind, script links in any spelling, data: URIs, remote images, styles, frames — reaches the page as
text or not at all. Both layers are tested: the Markdown renderer and, on its own, the sanitiser behind it."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from operator_ui import markdown
from operator_ui.markdown import render, sanitise

ALLOWED_TAGS = set(markdown.ALLOWED_TAGS.split())
LINK_SCHEMES = ("http://", "https://", "mailto:")


class Elements(HTMLParser):
    """Every start tag of a fragment with its attributes, and the fragment's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parsed(fragment: str) -> Elements:
    elements = Elements()
    elements.feed(fragment)
    elements.close()
    return elements


def assert_harmless(fragment: str) -> None:
    """Only the allowed tags; no event handler, style or src; every link http(s) or mailto, rel'd."""
    for tag, attributes in parsed(fragment).tags:
        assert tag in ALLOWED_TAGS, (tag, fragment)
        assert not any(name.startswith("on") for name in attributes), (tag, attributes)
        assert "style" not in attributes and "src" not in attributes, (tag, attributes)
        if tag == "a":
            href = attributes.get("href")
            assert href is None or href.startswith(LINK_SCHEMES), href
            assert attributes.get("rel") == "noopener noreferrer nofollow"
        if tag == "button":
            assert attributes.get("type") == "button"


def tags_of(fragment: str) -> list[str]:
    return [tag for tag, _ in parsed(fragment).tags]


def text_of(fragment: str) -> str:
    return "".join(parsed(fragment).text)


# --- what a model writes --------------------------------------------------------------------------


def test_emphasis_lists_quotes_and_line_breaks_are_drawn():
    out = render(
        "Some **bold**, *em*, ~~gone~~ and `x < y`.\nNext line\n\n- one\n- two\n\n3. three\n4. four\n\n> quoted"
    )

    assert "<strong>bold</strong>" in out and "<em>em</em>" in out and "<s>gone</s>" in out
    assert "<code>x &lt; y</code>" in out
    assert "<br>\nNext line" in out  # a newline in a chat message is a line break
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in out
    assert '<ol start="3">\n<li>three</li>' in out
    assert "<blockquote>\n<p>quoted</p>\n</blockquote>" in out
    assert_harmless(out)


def test_a_link_keeps_its_address_and_title_and_is_marked_nofollow():
    out = render('[docs](https://example.com/a?b=1&c=2 "The docs") <https://auto.example/x> [mail](mailto:a@b.example)')

    assert (
        '<a href="https://example.com/a?b=1&amp;c=2" title="The docs" rel="noopener noreferrer nofollow">docs</a>'
        in out
    )
    assert '<a href="https://auto.example/x" rel="noopener noreferrer nofollow">https://auto.example/x</a>' in out
    assert '<a href="mailto:a@b.example" rel="noopener noreferrer nofollow">mail</a>' in out


def test_a_table_is_drawn_with_its_alignment_as_classes_not_styles():
    out = render("| name | count | note |\n|:-----|------:|:----:|\n| a | 1 | x |\n| b | 22 | y |")

    row = ["tr", "td", "td", "td"]
    assert tags_of(out) == ["table", "thead", "tr", "th", "th", "th", "tbody", *row, *row]
    assert '<th class="align-left">name</th>' in out and '<td class="align-right">22</td>' in out
    assert '<td class="align-center">y</td>' in out
    assert "style" not in out


def test_headings_start_below_the_page_s_own():
    out = render("# One\n## Two\n### Three\n#### Four\n###### Six")

    assert tags_of(out) == ["h4", "h5", "h6", "h6", "h6"]
    assert "<h4>One</h4>" in out and "<h5>Two</h5>" in out


def test_fenced_code_is_highlighted_by_its_language_with_a_copy_button_naming_its_block():
    out = render("```python\ndef f(x):\n    return x < 1\n```", "m-e1-0")

    assert '<span class="code-lang">python</span>' in out
    assert '<span class="k">def</span>' in out and '<span class="nf">f</span>' in out
    assert '<span class="o">&lt;</span>' in out
    assert '<button class="copy" data-copy-from="m-e1-0-code-1" hidden="" type="button">Copy</button>' in out
    assert '<pre id="m-e1-0-code-1"><code class="highlight">' in out
    # What the button copies (the block's text) is the code itself.
    block = out.split('<pre id="m-e1-0-code-1">', 1)[1].split("</pre>", 1)[0]
    assert text_of(block) == "def f(x):\n    return x < 1\n"


def test_code_of_an_unknown_language_or_without_one_is_escaped_text_and_each_block_has_its_own_id():
    out = render("```nosuchlanguage\n<b>bold?</b>\n```\n\n```\nplain & simple\n```\n\n    indented <i>", "m-2")

    assert "&lt;b&gt;bold?&lt;/b&gt;" in out and "<span class=" not in out.split("nosuchlanguage")[1]
    assert "plain &amp; simple" in out and "indented &lt;i&gt;" in out
    ids = [attributes["id"] for tag, attributes in parsed(out).tags if tag == "pre"]
    targets = [attributes["data-copy-from"] for tag, attributes in parsed(out).tags if tag == "button"]
    assert ids == targets == ["m-2-code-1", "m-2-code-2", "m-2-code-3"]


def test_a_block_id_is_reduced_to_characters_an_id_may_hold():
    out = render("```\nx\n```", 'm"><script>')

    assert 'id="m---script--code-1"' in out
    assert_harmless(out)


# --- what a hostile model writes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<script>alert(1)</script>",
        "<SCRIPT SRC=https://evil.example/x.js></SCRIPT>",
        '<img src="x" onerror="alert(1)">',
        '<div onclick="alert(1)">click</div>',
        '<p style="background:url(javascript:alert(1))">styled</p>',
        '<iframe src="https://evil.example"></iframe>',
        "<!-- a comment --> and <!--> <![CDATA[x]]>",
        '<a href="javascript:alert(1)">html link</a>',
        "<svg onload=alert(1)><circle r=1 /></svg>",
        '<form action="https://evil.example"><button>Go</button></form>',
        "<style>body { display: none }</style>",
        '<meta http-equiv="refresh" content="0;url=https://evil.example">',
    ],
)
def test_html_in_the_text_is_shown_as_the_characters_it_is(text):
    out = render(text)

    assert text_of(out).strip() == text
    assert tags_of(out) == ["p"]
    assert_harmless(out)


@pytest.mark.parametrize(
    "destination",
    [
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        " javascript:alert(1)",
        "&#106;avascript:alert(1)",
        "&#x6A;&#x61;&#x76;&#x61;script:alert(1)",
        "javascript&colon;alert(1)",
        "%6Aavascript:alert(1)",
        "java\tscript:alert(1)",
        "<javascript:alert(1)>",
        "vbscript:msgbox(1)",
        "VBScript:msgbox(1)",
        "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
        "DATA:text/html,<script>alert(1)</script>",
        "file:///etc/passwd",
        "/ui/sessions/",
        "//evil.example/x",
        "evil.example",
    ],
)
def test_a_link_to_anything_but_http_https_or_mailto_is_not_made(destination):
    for text in (f"[click]({destination})", f"<{destination}>", f"[click]\n\n[click]: {destination}"):
        out = render(text)

        assert "<a" not in out, (text, out)
        assert_harmless(out)


def test_an_autolink_in_a_script_scheme_stays_text():
    out = render("<javascript:alert(1)> <JAVASCRIPT:alert(1)>")

    assert out == "<p>&lt;javascript:alert(1)&gt; &lt;JAVASCRIPT:alert(1)&gt;</p>\n"


def test_a_title_or_an_info_string_cannot_break_out_of_its_attribute():
    out = render('[x](https://ok.example "a\\" onmouseover=\\"alert(1)")\n\n```python" onclick="alert(1)\ncode\n```')

    assert_harmless(out)
    assert 'title="a&quot; onmouseover=&quot;alert(1)"' in out
    assert "code-lang" not in out  # not a language name: no label, no highlighting


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("![a pixel](https://evil.example/pixel.png)", "image: a pixel"),
        ('![](https://evil.example/pixel.png "t")', "image: image"),
        ("[![badge](https://evil.example/b.svg)](https://ok.example)", "image: badge"),
    ],
)
def test_a_remote_image_is_a_link_to_it_never_loaded(text, shown):
    out = render(text)

    assert "<img" not in out and "src=" not in out
    assert shown in text_of(out)
    assert_harmless(out)


@pytest.mark.parametrize(
    "text",
    [
        "![x](data:image/png;base64,iVBORw0KGgo=)",
        "![x](javascript:alert(1))",
        "![x](data:image/svg+xml,<svg onload=x>)",
    ],
)
def test_an_image_from_a_data_or_script_address_is_neither_loaded_nor_linked(text):
    out = render(text)

    assert "<img" not in out and "<a" not in out
    assert_harmless(out)


@pytest.mark.parametrize(
    ("html", "kept"),
    [
        ('<a href="JaVaScRiPt:alert(1)" onclick="x">a</a>', '<a rel="noopener noreferrer nofollow">a</a>'),
        ('<a href="&#106;avascript:x">b</a>', '<a rel="noopener noreferrer nofollow">b</a>'),
        ('<a href="java&#x09;script:x">c</a>', '<a rel="noopener noreferrer nofollow">c</a>'),
        ('<a href="data:text/html,x">d</a>', '<a rel="noopener noreferrer nofollow">d</a>'),
        ('<a href="/ui/logout/">e</a>', '<a rel="noopener noreferrer nofollow">e</a>'),
        ('<a href="https://ok.example" target="_top">f</a>',
         '<a href="https://ok.example" rel="noopener noreferrer nofollow">f</a>'),
        ("<img src=https://evil.example/x.png>g", "g"),
        ('<iframe src="https://evil.example"></iframe>h', "h"),
        ("<script>alert(1)</script>i", "i"),
        ("<style>p { color: red }</style>j", "j"),
        ('<p style="color:red" onmouseover="x">k</p>', "<p>k</p>"),
        ("<!-- comment -->l", "l"),
        ('<span class="evil k">m</span>', '<span class="k">m</span>'),
        ('<button type="submit" formaction="/x" onclick="y">n</button>', '<button type="button">n</button>'),
        ("<form><input name=o></form>o", "o"),
    ],
)  # fmt: skip
def test_the_sanitiser_behind_the_renderer_keeps_only_what_the_renderer_writes(html, kept):
    assert sanitise(html) == kept


# --- bounded work ---------------------------------------------------------------------------------


def test_a_very_long_text_is_cut_with_a_note():
    text = ("A line with **bold** and a [link](https://example.com).\n\n" * 20_000)[:1_000_000]

    out = render(text)

    assert len(text) == 1_000_000
    assert f"… cut: the first {markdown.SOURCE_LIMIT:,} of 1,000,000 characters are shown." in out
    assert out.count("<strong>bold</strong>") < markdown.SOURCE_LIMIT // 50
    assert_harmless(out)


@pytest.mark.parametrize(
    ("text", "nested_tag"),
    [(">" * 10_000 + " deep", "blockquote"), ("- " * 10_000 + "deep", "ul"), ("1. " * 10_000 + "deep", "ol")],
)
def test_deep_nesting_stops_at_the_limit_and_keeps_the_text(text, nested_tag):
    out = render(text)

    assert "deep" in text_of(out)
    assert 0 < tags_of(out).count(nested_tag) <= markdown.NESTING_LIMIT


def test_a_deep_structure_does_not_swallow_what_follows_it():
    out = render("> " * 60 + "inside\n\nafter")

    assert out.endswith("<p>after</p>\n")
    assert "inside" in text_of(out)


@pytest.mark.parametrize("text", ["[" * 10_000 + "a" + "]" * 10_000 + "(x)", "*" * 10_000 + "a" + "*" * 10_000,
                                  "`" * 10_000 + "a", "[a](" * 10_000, "<" * 10_000 + "a"])  # fmt: skip
def test_pathological_inline_runs_render_to_their_text(text):
    out = render(text)

    assert "a" in text_of(out)
    assert_harmless(out)
