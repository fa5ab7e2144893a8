"""The report's HTML pieces against hand-written HTML: escaping, numbers, tables,
sections, notes and embedded figures."""

from __future__ import annotations

import base64
import io

from matplotlib.figure import Figure
from PIL import Image

from rnnkit.app.report.html import CSP, esc, fmt, image, note, section, table


def test_escaping_covers_markup_and_both_quotes():
    assert esc('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    assert esc(3.5) == "3.5"


def test_numbers_for_tables():
    assert fmt(10_000.0) == "10,000" and fmt(-12_345.6) == "-12,346"
    assert fmt(9_999.4) == "9999" and fmt(0.5) == "0.5"
    assert fmt(float("nan")) == "nan" and fmt(float("-inf")) == "-inf"
    assert fmt(True) == "True" and fmt("<b>") == "&lt;b&gt;"


def test_table_heads_rows_and_right_aligns_numbers_only():
    got = table([["a<", 1, 2.5, "x", False, None]], ["h", "n"])
    assert got == (
        "<table>\n<tr><th>h</th><th>n</th></tr>\n"
        "<tr><th>a&lt;</th><td class=num>1</td><td class=num>2.5</td><td>x</td>"
        "<td>False</td><td>—</td></tr>\n</table>"
    )
    assert table([]) == "<table>\n</table>"


def test_section_and_note():
    assert section("m", "A & B", "<p>x</p>") == (
        "m",
        "A & B",
        '<section id="m"><h2>A &amp; B</h2>\n<p>x</p>\n</section>',
    )
    assert note("n < 1") == '<p class="note">n &lt; 1</p>'


def test_image_is_an_embedded_png_of_the_figure_size():
    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    got = image(fig, 'a "line"', "x < y")
    head = '<figure><img src="data:image/png;base64,'
    assert got.startswith(head)
    data, rest = got[len(head) :].split('"', 1)
    assert rest == (
        ' alt="a &quot;line&quot;" width="200" height="100">'
        "<figcaption>x &lt; y</figcaption></figure>"
    )
    with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as im:
        assert im.format == "PNG" and im.size == (200, 100)
    assert "<figcaption>" not in image(Figure(figsize=(1, 1)), "empty")


def test_the_page_may_load_nothing_from_outside():
    assert CSP.startswith("default-src 'none';")
