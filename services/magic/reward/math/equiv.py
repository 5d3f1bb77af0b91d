"""Is a final answer equivalent to the gold answer? Reading answers, then comparing them.

`equivalent(gold, answer, choices)` returns a `Judgement` (equal or not, and why). It reads both
strings the same way (`read`): a multiple-choice letter, a plain word, or a list of one or more
items, each an expression parsed by Math-Verify's LaTeX parser after its unit, percent sign or
degree mark has been taken off and remembered. Then (`same_items`, `same_value`):

* **lists** match item for item — in order for tuples and points, as a one-to-one matching for
  sets and comma lists (``1, 2`` equals ``2, 1``; ``2`` never equals ``2, 3``: no partial credit
  for naming several answers);
* **numbers** compare exactly (at 50 significant digits, so ``1/2^99 != 1/2^98``) unless a
  decimal is involved: a decimal gold fixes the precision (``3.14`` accepts ``\\pi``); a decimal
  answer to an exact gold must agree to a relative 1e-6 (``0.333333`` for ``1/3``, not ``0.33``);
* **expressions** with variables must use the same variables and agree at random points;
* **equations** are equivalent when one is a nonzero multiple of the other (``2x=4`` and
  ``x=2``); ``x = 5`` (a variable assigned a value) equals ``5``; an equation never collapses
  to a number (``x^2-4=0`` is not ``0``);
* **inequalities and intervals** compare as sets of reals (``1<x<3`` equals ``(1,3)``);
* **units** (length, area, volume, time, mass, money, speed) convert when both sides name
  one (``100 cm`` equals ``1 m``; ``10 cm`` is not ``10 m``); a unit on one side only, or a
  word the table does not know (``5 apples``), is ignored;
* **percentages**: ``50\\%`` equals ``50`` and ``0.5`` (as Math-Verify has it);
* **degrees** equal radians when a degree mark is written (``30^\\circ`` equals ``\\pi/6``);
  a bare number next to a gold in degrees counts as degrees;
* **multiple choice**: letters compare as letters; with the problem's options known, a letter
  equals the option's text and the text the letter.

Everything runs on sympy objects; nothing here turns a sympy object into a string (huge
objects would take forever to print). Callers bound the wall-clock time from outside
(`magic.reward.timeboxed`): sympy can run for a long time on hostile input.

Both steps are pure functions of their strings, so each worker process keeps its most recent
results (`CACHE_SIZE` of each): parsed answers (`parse_latex`, the costly part: Math-Verify's
ANTLR parser in pure Python) and whole judgements (`equivalent`). A group's gs samples share one
gold and often one answer, so many of a step's verifications repeat a parse or a judgement. The
parser itself runs with two speed-ups that leave its results unchanged (`fast_latex2sympy`).
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction

import sympy
from sympy import Basic, Eq, FiniteSet, Float, Interval, MatrixBase, Symbol, Tuple, Union
from sympy.core.relational import Relational
from sympy.logic.boolalg import And, BooleanAtom, Or

from magic.reward.math.extract import clean_latex, merge_thousands, parse_choice, split_top_level

EXACT_DIGITS = 50
"""Exact numbers are compared at this many significant digits."""
EXACT_REL_TOL = sympy.Float("1e-40", EXACT_DIGITS)
DECIMAL_REL_TOL = 1e-6
"""A decimal answer to an exact gold must agree to this relative tolerance."""
MAX_NODES = 4000
"""Parsed answers with more sympy nodes than this are not compared (judged not equal)."""
CACHE_SIZE = 2048
"""Parsed answers, and judgements, kept per worker process (the least recently used dropped).
Bounded in memory: a parsed answer as long as allowed (`math_verifier.MAX_ANSWER_CHARS`) holds ≈ 22 KB,
so a worker's caches stay under ≈ 50 MB even when every answer is new and as long as allowed."""


@dataclass(frozen=True)
class Judgement:
    equal: bool
    reason: str


# -- units --------------------------------------------------------------------------------------

# name -> (dimension, factor to the base unit). Dimensions: L length (m), M mass (kg),
# T time (s), USD money (dollars), V volume (m^3). Plurals are handled by `_unit_key`.
_UNITS: dict[str, tuple[str, Fraction]] = {
    "m": ("L", Fraction(1)), "meter": ("L", Fraction(1)), "metre": ("L", Fraction(1)),
    "mm": ("L", Fraction(1, 1000)), "millimeter": ("L", Fraction(1, 1000)),
    "cm": ("L", Fraction(1, 100)), "centimeter": ("L", Fraction(1, 100)),
    "km": ("L", Fraction(1000)), "kilometer": ("L", Fraction(1000)),
    "inch": ("L", Fraction(254, 10000)), "inche": ("L", Fraction(254, 10000)),
    "ft": ("L", Fraction(3048, 10000)), "foot": ("L", Fraction(3048, 10000)), "feet": ("L", Fraction(3048, 10000)),
    "yd": ("L", Fraction(9144, 10000)), "yard": ("L", Fraction(9144, 10000)),
    "mi": ("L", Fraction(1609344, 1000)), "mile": ("L", Fraction(1609344, 1000)),
    "g": ("M", Fraction(1, 1000)), "gram": ("M", Fraction(1, 1000)), "mg": ("M", Fraction(1, 10**6)),
    "kg": ("M", Fraction(1)), "kilogram": ("M", Fraction(1)),
    "lb": ("M", Fraction(45359237, 10**8)), "pound": ("M", Fraction(45359237, 10**8)),
    "oz": ("M", Fraction(28349523125, 10**12)), "ounce": ("M", Fraction(28349523125, 10**12)),
    "s": ("T", Fraction(1)), "sec": ("T", Fraction(1)), "second": ("T", Fraction(1)),
    "min": ("T", Fraction(60)), "minute": ("T", Fraction(60)),
    "h": ("T", Fraction(3600)), "hr": ("T", Fraction(3600)), "hour": ("T", Fraction(3600)),
    "day": ("T", Fraction(86400)), "week": ("T", Fraction(604800)),
    "dollar": ("USD", Fraction(1)), "cent": ("USD", Fraction(1, 100)),
    "l": ("V", Fraction(1, 1000)), "liter": ("V", Fraction(1, 1000)), "litre": ("V", Fraction(1, 1000)),
    "ml": ("V", Fraction(1, 10**6)), "milliliter": ("V", Fraction(1, 10**6)),
    "in": ("L", Fraction(254, 10000)),
    "mph": ("L/T", Fraction(1609344, 3600 * 1000)),
}
_LENGTH_POWER = {"L": 1}
_NOT_UNITS = {"and", "or", "the", "is", "of", "to", "in", "at", "for", "are", "ways", "x", "y", "z"}
_VALUE_WORDS = {
    "squared", "cubed", "root", "roots", "power", "powers", "factorial", "choose", "over", "times", "fold",
    "million", "millions", "billion", "billions", "trillion", "thousand", "thousands", "hundred", "hundreds", "dozen", "dozens",
    "half", "halves", "third", "thirds", "quarter", "quarters", "percentile", "minus", "plus", "negative", "not", "no",
    "less", "more", "least", "most", "than", "between", "approx", "pi", "e", "i", "th", "st", "nd", "rd",
    "greater", "fewer", "higher", "lower", "above", "below", "under", "up", "so", "roughly", "approximately", "around",
    "about", "nearly", "almost", "ish", "maybe", "tops", "max", "min", "maximum", "minimum", "tens", "tenths", "hundredths",
    "thousandths", "doubled", "tripled", "twice", "thrice", "pair", "pairs", "inclusive", "exclusive", "or", "and", "to",
}
"""Words after a number that change its value or hedge it (``5 squared``, ``3 million``, ``7 or
less``): never a unit that can be dropped, so the answer is read as what it says and refused."""


@dataclass(frozen=True)
class Unit:
    """A known unit: its dimension (e.g. ``L^2``) and the factor to the SI/base unit."""

    dimension: str
    factor: Fraction


def _unit_key(word: str) -> str | None:
    w = word.lower().rstrip(".")
    if w in _UNITS:
        return w
    if len(w) > 2 and w.endswith("s") and w[:-1] in _UNITS:
        return w[:-1]
    return None


def _simple_unit(words: list[str], power: int) -> Unit | None:
    """``cm``, ``square feet``, ``cubic meters``, ``cm^2`` -> a Unit; None if not a known unit."""
    if words and words[0].lower() in ("square", "sq", "sq."):
        power, words = 2, words[1:]
    elif words and words[0].lower() == "cubic":
        power, words = 3, words[1:]
    if len(words) != 1:
        return None
    key = _unit_key(words[0])
    if key is None or (len(key) == 1 and key not in ("m", "g", "s", "h", "l")):
        return None
    dim, factor = _UNITS[key]
    if power == 1:
        return Unit(dim, factor)
    if dim != "L":
        return None
    return Unit(f"L^{power}", factor**power)


_POWER = re.compile(r"\^\{?([23])\}?")


def parse_unit(text: str) -> Unit | None:
    """A unit written as text — ``cm``, ``cm^2``, ``square feet``, ``m/s``, ``miles per hour``.

    >>> parse_unit("cm^2")
    Unit(dimension='L^2', factor=Fraction(1, 10000))
    >>> parse_unit("miles per hour").dimension
    'L/T'
    >>> parse_unit("apples") is None
    True
    """
    text = text.strip()
    for sep in (" per ", "/"):
        if sep in text:
            num, _, den = text.partition(sep)
            a, b = parse_unit(num), parse_unit(den)
            if a is None or b is None or "/" in a.dimension or "/" in b.dimension:
                return None
            return Unit(f"{a.dimension}/{b.dimension}", a.factor / b.factor)
    power = 1
    m = _POWER.search(text)
    if m:
        power = int(m.group(1))
        text = text[: m.start()] + text[m.end() :]
    unit = _simple_unit(text.split(), power)
    if unit is not None and unit.dimension == "L/T":
        return unit
    return unit


# -- reading an answer --------------------------------------------------------------------------


@dataclass
class Item:
    """One answer: a parsed expression and what was written around it."""

    raw: str
    expr: Basic | MatrixBase | None = None
    unit: Unit | None = None
    percent: bool = False
    degrees: bool = False
    decimals: int | None = None  # digits after the point when the item is a plain decimal
    head: tuple[str, str] | None = None  # (function, variable) of a function rule ``f(t) = ...``, when written so


@dataclass
class Reading:
    """A whole answer as read: a choice letter, a text answer, or one or more items."""

    text: str
    choice: str | None = None
    words: str | None = None
    items: list[Item] = field(default_factory=list)
    parameter: str | None = None  # a parameter the answer declares (``... for some integer t``)
    ordered: bool = False  # a list whose entries name their places (``T(10) = 2, T(11) = 4``): compared in order


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|operatorname|mathbf|textit|emph)\{([^{}]*)\}")
_DEGREE = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)\s*$")
_PERCENT = re.compile(r"(?:\\%|%|\\text\{\s*percent\s*\}|\bpercent)\s*$")
_UNIT_TAIL = re.compile(
    r"(?:\s*(?:\\text\{[^{}]*\}|\\mathrm\{[^{}]*\}|\\operatorname\{[^{}]*\}|(?<![\\A-Za-z])[A-Za-z]+\.?|\^\{?[23]\}?|/))+\s*$"
)
_WORDS = re.compile(r"^[A-Za-z][A-Za-z .'-]*$")
_LIST_WORDS = re.compile(r"\s*(?:\\text\{\s*(?:or|and)\s*\}|\b(?:or|and)\b)\s*")
_NUMERIC_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}A-Za-z]*)\}")
_INEQUALITY = re.compile(r"<|>|\\le|\\ge|\\lt|\\gt|\\leq|\\geq|≤|≥")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)")
_MIXED_NUMBER = re.compile(r"^(-?)(\d{1,9})\s*\\frac\{(\d{1,9})\}\{(\d{1,9})\}$")
MAX_ITEMS = 32
"""An answer listing more values than this is not compared (judged not equal)."""
_MATH_WORDS = {"sin", "cos", "tan", "log", "ln", "exp", "sqrt", "pi", "infty", "inf"}
_BINARY_SIGN = re.compile(r"(?<=[\w})\]])\s*[+-]")
"""A plus or minus after an operand: the text is a sum, not a single quantity."""
_CLOCK_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(?:\\text\{\s*)?(a\.?m\.?|p\.?m\.?)?(?:\s*\})?$", re.IGNORECASE)
"""``12:00``, ``9:05 pm``, ``10:30:15``: a time of day (never a ratio or a division)."""
_FUNCTION_HEAD = re.compile(r"^\s*([A-Za-z](?:_\{?\w+\}?)?)\s*\(\s*([A-Za-z])\s*\)\s*=\s*(.+)$")
"""``f(x) = ...``: a function given by its rule; the rule is the answer, in its variable."""
_MEMBER_OF = re.compile(r"^[A-Za-z]\s*\\in\s*(.+)$")
"""``x \\in [1, 2)``: the answer is the set after ``\\in``."""
_SET_BUILDER = re.compile(r"^\\\{\s*([A-Za-z])\s*(?:\||\\mid|:)\s*(.+?)\s*\\\}$")
"""``\\{x \\mid -1 < x < 1\\}``: the set of the x satisfying a condition."""


def clock_time(s: str) -> str | None:
    """A time of day, normalised (``09:05 PM`` -> ``9:05 pm``); None when `s` is not one.

    >>> clock_time("12:00"), clock_time("09:05 P.M."), clock_time("3:2"), clock_time("1:75")
    ('12:00', '9:05 pm', None, None)
    """
    m = _CLOCK_TIME.match(s.strip())
    if not m or int(m.group(2)) > 59 or int(m.group(1)) > 24:
        return None
    hm = f"{int(m.group(1))}:{m.group(2)}" + (f":{m.group(3)}" if m.group(3) else "")
    half = (m.group(4) or "").lower().replace(".", "")
    return f"{hm} {half}" if half else hm


def _strip_dollar(s: str) -> tuple[str, bool]:
    t = s.strip()
    if t.startswith("\\$"):
        return t[2:].strip(), True
    if re.match(r"^\$\s*\d[\d.,]*$", t):  # "$12.55": a lone dollar sign is money, not math
        return t[1:].strip(), True
    if t.endswith("\\$"):
        return t[:-2].strip(), True
    return t, False


def _split_unit(s: str) -> tuple[str, str]:
    """``10\\text{ cm}`` -> (``10``, ``cm``); no unit -> (s, "")."""
    m = _UNIT_TAIL.search(s)
    if not m or m.start() == 0:
        return s, ""
    tail = _TEXT_WRAP.sub(r" \1 ", m.group(0)).strip()
    words = re.findall(r"[A-Za-z]+", tail)
    if not words or any(w.lower() in _MATH_WORDS or w.lower() in _VALUE_WORDS for w in words):
        return s, ""
    wrapped = "\\text" in m.group(0) or "\\mathrm" in m.group(0)
    if re.search(r"\d", _POWER.sub("", tail)):
        return s, ""  # "5 \text{ or 6}": another value, not a unit
    if not wrapped and any(w.lower() in _NOT_UNITS for w in words):
        return s, ""  # "x in S", "1 or 2": words of a sentence, not a unit
    # a single plain letter after a number is a variable ("2 x"), unless it is \text'ed
    if len(words) == 1 and len(words[0]) == 1 and not wrapped:
        if _unit_key(words[0]) is None or not m.group(0)[:1].isspace():
            return s, ""
    value = s[: m.start()].strip()
    if not value or value[-1] in "+-*/^_=(\\":
        return s, ""
    if not wrapped and _BINARY_SIGN.search(value):
        return s, ""  # "1+2m": a letter inside an expression is a variable, not a unit
    return value, tail


def read_item(raw: str) -> Item:
    """Take one answer apart: unit, percent sign, degree mark, then parse what is left."""
    s = clean_latex(_NUMERIC_TEXT.sub(r"\1", merge_thousands(raw.strip())))  # \text{14} is the number 14
    item = Item(raw=s)
    s, dollars = _strip_dollar(s)
    if _PERCENT.search(s):
        item.percent, s = True, _PERCENT.sub("", s).strip()
    if _DEGREE.search(s) and not _TRIG.search(s):
        item.degrees, s = True, _DEGREE.sub("", s).strip()
    value, unit_text = _split_unit(s)
    if unit_text:
        s = value
        low = unit_text.lower()
        if low in ("degree", "degrees", "deg"):
            item.degrees = True
        elif low in ("percent", "%"):
            item.percent = True
        elif low not in ("rad", "radian", "radians"):
            item.unit = parse_unit(unit_text)
    if dollars and item.unit is None:
        item.unit = Unit("USD", Fraction(1))
    s = merge_thousands(s)
    mixed = _MIXED_NUMBER.match(s)
    if mixed:  # 2\frac{1}{3} is two and a third, not 2/3
        sign, whole, num, den = mixed.groups()
        s = f"{sign}\\frac{{{int(whole) * int(den) + int(num)}}}{{{den}}}"
    if re.fullmatch(r"[+-]?\d*\.\d+", s):
        item.decimals = len(s.split(".")[1])
    if "\\circ" in s or "°" in s:  # degrees inside an expression: \sin 30^\circ
        s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°", r"\\cdot \\frac{\\pi}{180}", s)
    head = _FUNCTION_HEAD.match(s)
    if head and "=" not in head.group(3) and re.search(rf"(?<![A-Za-z\\]){head.group(2)}(?![A-Za-z])", head.group(3)):
        s = head.group(3)  # the rule, when it uses the variable ("f(x) = 0" stays an equation)
    else:
        head = None
    item.expr = parse_latex(s)
    item.head = (head.group(1), head.group(2)) if head else None
    return item


_PLAIN_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)\.[0-9]+")


def fast_latex2sympy() -> bool:
    """Two speed-ups of latex2sympy, the LaTeX parser Math-Verify runs, that leave its results
    unchanged (the test compares every answer of the corpus with the parser as released):

    * **ANTLR's two-stage prediction.** latex2sympy parses in full-LL prediction mode, whose
      full-context predictions are most of a verification's time. ANTLR documents SLL prediction
      as returning either the parse tree LL would return or a syntax error
      (`PredictionMode.SLL`); latex2sympy raises on any syntax error, so an error means "parse
      again in LL mode", and every tree is LL's. Parsing the corpus: 2.7x faster.
    * **Number literals.** `sympy.Number(text)` runs sympy's whole expression parser on every
      number literal (≈ 1.6 ms); a plain integer or decimal is built directly instead
      (`Integer(int(text))`, `Float(text)`: the same objects, the same precision).

    Idempotent. Returns False, changing nothing, when latex2sympy's internals are not the ones
    this was written against (1.11: `_Latex2Sympy.create_parser` and `.parse_number`); parsing is
    then slower, not different. Each replaced method keeps the released one as `.released`.
    """
    try:
        from antlr4.atn.PredictionMode import PredictionMode
        from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy
    except ImportError:
        return False
    create, number = getattr(_Latex2Sympy, "create_parser", None), getattr(_Latex2Sympy, "parse_number", None)
    if create is None or number is None:
        return False
    if hasattr(create, "released"):
        return True

    def create_parser(self, latex_str):
        parser = create(self, latex_str)
        parser._interp.predictionMode = PredictionMode.SLL
        sll = parser.math

        def math():
            try:
                return sll()
            except Exception:  # noqa: BLE001 — a syntax error in SLL mode: parse again in LL mode
                return create(self, latex_str).math()

        parser.math = math
        return parser

    def parse_number(self, text):
        t = text.replace(",", "")
        if t.isascii() and t.isdigit():
            return sympy.Integer(int(t))  # the released method strips leading zeros, then Number(t)
        if t.isascii() and _PLAIN_DECIMAL.fullmatch(t):
            return Float(t)
        return number(self, text)

    create_parser.released, parse_number.released = create, number
    _Latex2Sympy.create_parser, _Latex2Sympy.parse_number = create_parser, parse_number
    return True


@functools.lru_cache(maxsize=CACHE_SIZE)
def parse_latex(s: str) -> Basic | MatrixBase | None:
    """Math-Verify's LaTeX parser on one answer (as if boxed); None when it cannot parse it.
    Cached (`CACHE_SIZE`), so the result is shared: a matrix comes back immutable."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
    from math_verify import parse
    from math_verify.parser import LatexExtractionConfig

    if not s.strip():
        return None
    fast_latex2sympy()
    config = LatexExtractionConfig(
        boxed_match_priority=0,
        normalization_config=NormalizationConfig(basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False),
    )
    try:
        out = parse("\\boxed{" + s + "}", extraction_config=[config], parsing_timeout=None)
    except RecursionError:
        return None
    for value in out:
        if isinstance(value, MatrixBase):
            return value.as_immutable()
        if isinstance(value, Basic):
            return value
    return None


def _text_answer(s: str) -> str | None:
    """A word answer (``yes``, ``\\text{Monday}``, ``odd``), lower-cased; None for math."""
    t = _TEXT_WRAP.sub(r"\1", s).strip()
    wrapped = t != s.strip()
    if _WORDS.match(t) and len(t.replace(" ", "")) >= (2 if wrapped else 3) and t.lower() not in _MATH_WORDS:
        if _unit_key(t) is None and not parse_unit(t):
            return " ".join(t.lower().split())
    return None


def _plain_words(s: str) -> str:
    return " ".join(_TEXT_WRAP.sub(r"\1", s).lower().split())


def _unwrap_set(s: str) -> tuple[str, bool]:
    if s.startswith("\\{") and s.endswith("\\}"):
        return s[2:-2].strip(), True
    return s, False


def _expand_pm(s: str) -> list[str]:
    """``1 \\pm \\sqrt{2}`` names two answers: ``1 + \\sqrt{2}`` and ``1 - \\sqrt{2}``; a point
    with a sign of its own in several coordinates names every combination:
    ``(\\pm 1, 0, \\pm 2)`` is four points."""
    signs = s.count("\\pm")
    if signs == 1 and "\\mp" not in s:
        return [s.replace("\\pm", "+"), s.replace("\\pm", "-")]
    t = s.strip()
    if 2 <= signs <= 3 and "\\mp" not in s and t.startswith("(") and t.endswith(")"):
        coordinates = split_top_level(t[1:-1])
        if len(coordinates) > 1 and all(c.count("\\pm") <= 1 for c in coordinates):
            options = [[c.replace("\\pm", "+"), c.replace("\\pm", "-")] if "\\pm" in c else [c] for c in coordinates]
            return ["(" + ", ".join(combination) + ")" for combination in itertools.product(*options)]
    return [s]


_SEQUENCE_LABEL = re.compile(r"^\s*(?P<f>[A-Za-wA-Z])\s*\(\s*(?P<at>-?\d{1,6})\s*\)\s*=\s*(?P<value>[^=]+)$")


_EXTREME = re.compile(r"^\s*(?:\\text\{\s*)?(?P<which>max|min|maximum|minimum|largest|smallest|greatest|least)(?: value)?\s*\}?\s*[=:]\s*(?P<value>[^=:]+)$", re.IGNORECASE)


def _extremes(parts: list[str]) -> list[Item] | None:
    """``Maximum = 2, Minimum = 1``: the two values, smallest first, when one is named the maximum
    and the other the minimum and the maximum is not below the minimum (``Minimum = 2, Maximum =
    1`` is no answer); None for anything else."""
    found = [_EXTREME.match(q) for q in parts]
    if len(parts) != 2 or not all(found):
        return None
    high = {m.group("which").lower() in ("max", "maximum", "largest", "greatest") for m in found}
    if high != {True, False}:
        return None
    items = {m.group("which").lower() in ("max", "maximum", "largest", "greatest"): read_item(m.group("value").strip()) for m in found}
    low, top = items[False], items[True]
    if low.expr is None or top.expr is None or not (_is_number(low.expr) and _is_number(top.expr)):
        return None
    try:
        if bool(top.expr < low.expr):
            return None
    except TypeError:
        return None
    return [low, top]


def _sequence_values(parts: list[str]) -> list[str] | None:
    """``T(10) = 2, T(11) = 4, T(12) = 3``: one function at increasing whole numbers, its values in
    that order (compared in order with a gold list); None for anything else. Other names of list
    entries (``Maximum = 2``, ``Paolo: 18``) are never dropped: a name can change the value
    (``Reciprocal = 2``) or be swapped (``Minimum = 2, Maximum = 1``)."""
    found = [_SEQUENCE_LABEL.match(q) for q in parts]
    if not all(found) or len({m.group("f") for m in found}) != 1 or found[0].group("f") in "xyz":
        return None
    at = [int(m.group("at")) for m in found]
    if any(b <= a for a, b in zip(at, at[1:])):
        return None
    return [m.group("value").strip() for m in found]


_LABEL = re.compile(r"^\s*(?P<lhs>[^=<>]{1,40}?)\s*=\s*(?P<rhs>[^=]+)$")
_SUB = r"(?:_(?:\w|\{(?:[^{}]|\{[^{}]*\})*\}))?"
_GREEK = (
    r"alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|tau|upsilon|phi|"
    r"varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega"
)
_VAR = rf"(?:[A-Za-z]|\\(?:{_GREEK})|\\Delta\s*[A-Za-z]|\\(?:bar|hat|tilde|vec|overline)\{{[A-Za-z]\}}){_SUB}"
_POINTS = r"(?:[A-Z]{2,4}|\|[A-Z]{2,4}\||\\overline\{[A-Z]{2,4}\}|(?:m\s*)?\\angle\s*[A-Z]{1,3})"
_SAFE_LABEL = re.compile(rf"^\s*(?:\(\s*{_VAR}(?:\s*,\s*{_VAR})+\s*\)|{_POINTS}(?:\s*:\s*{_POINTS})*|{_VAR}(?:\s*:\s*{_VAR})?)\s*$")
"""What may name an answer's value (``(p,q) = (3,2)``, ``AB = 4``, ``|AB| = 1``, ``\\angle ABC = 30``,
``V_1:V_2 = 11:21``): variables and points only — not a function of the unknown (``\\sqrt{x} = 5``,
``\\ln x = 5``, ``x! = 6``) nor a word whose meaning depends on the question (``perimeter = 12``)."""
_SUBSCRIPT = re.compile(r"_\{[^{}]*\}|_\w")
_PRODUCT_LHS = re.compile(r"^\s*(?:[a-z]{2,3}|.*\\(?:sin|cos|tan|cot|sec|csc|log|ln)\b.*)\s*$")
"""``xy = 6``, ``\\rho\\sin\\theta = \\sqrt3``: a left side that is a product or a function of
variables, so the answer is an equation, not a named value."""


def _strip_var(s: str, labels: bool = False, strict: bool = False) -> str:
    """``x = 5`` -> ``5`` when one plain variable is assigned (lists of roots are written so);
    with `labels`, any name of what the value is: ``(p,q) = (3,2)``, ``|AB| = 1``,
    ``V_1:V_2 = 11:21`` (a left side with letters, no digits but in subscripts and no
    arithmetic); an equation (``a - b = 0``) or a function (``f(x) = 0``) keeps its left side.
    `strict` (a response's answer, untrusted): only the names `_SAFE_LABEL` allows.

    >>> _strip_var("x = 5"), _strip_var("AB = 4"), _strip_var("AB = 4", labels=True), _strip_var("2x = 4", labels=True)
    ('5', 'AB = 4', '4', '2x = 4')
    >>> _strip_var("x! = 6", labels=True, strict=True), _strip_var("perimeter = 12", labels=True, strict=True), _strip_var("|AB| = 1", labels=True, strict=True)
    ('x! = 6', 'perimeter = 12', '1')
    """
    m = re.match(r"^\s*([A-Za-z])(?:_\{?\w+\}?)?\s*=\s*(.+)$", s)
    if m and "=" not in m.group(2):
        return m.group(2).strip()
    if labels:
        m = _LABEL.match(s)
        if m:
            lhs = _SUBSCRIPT.sub("", m.group("lhs"))
            named = re.search(r"[A-Za-z]", lhs) and not re.search(r"[\d+\-*^]|\\cdot|\\times", lhs) and not _PRODUCT_LHS.match(lhs)
            function = re.match(r"^\s*[A-Za-z]\s*\(\s*[A-Za-z]\s*\)\s*$", lhs)  # f(x) = 0 is a function, not the number 0
            if named and not function and not _INEQUALITY.search(m.group("rhs")) and (not strict or _SAFE_LABEL.match(m.group("lhs"))):
                return m.group("rhs").strip()
    return s


_NUMBER_SET = r"\\mathbb\{[NZQR]\}(?:_\{[^{}]{1,8}\}|_[0-9+]|\^\{?[+*]\}?)?"
_SET_WORDS = (
    r"(?:(?:positive|negative|nonnegative|non-negative|nonzero|non-zero|real|natural|rational|whole) )?"
    r"(?:integers?|reals?|real numbers?|numbers?|rationals?|rational numbers?|natural numbers?)"
)
_RULE_DOMAIN = re.compile(
    rf"\s*,?\s*(?:\\text\{{\s*for (?:all|every|any|each)\s*\}}\s*[A-Za-z]\s*\\in\s*(?P<set>{_NUMBER_SET})"
    rf"|\\text\{{\s*for (?:all|every|any|each) (?P<words>{_SET_WORDS})\s*\}}\s*[A-Za-z]"
    rf"|\\text\{{\s*for (?:all|every|any|each) (?P<words2>{_SET_WORDS}) [A-Za-z]\s*\}})\s*"
)
"""``f(x) = 1 \\text{ for all } x \\in \\mathbb{Q}_{>0}``: the set a function rule is stated on. It is
read away only when the problem names that very set (`domains_of`): a rule stated on part of the
problem's domain (``for all negative integers x``, ``x \\in \\mathbb{R}_{>5}``) is left as written."""


def _set_key(text: str) -> str:
    return re.sub(r"\s+", "", text).replace("non-", "non").rstrip("s").lower() if "\\" not in text else re.sub(r"\s+", "", text)


def domains_of(problem: str) -> tuple[str, ...]:
    """The number sets a problem names (``\\mathbb{Q}_{>0}``, ``positive integers``), as keys of
    `_RULE_DOMAIN`'s sets.

    >>> domains_of(r"Find all $f: \\mathbb{Q}_{>0} \\to \\mathbb{Q}_{>0}$ such that, for all positive integers n, ...")
    ('\\\\mathbb{Q}_{>0}', 'positiveinteger')
    """
    text = clean_latex(problem[:20000])
    found = [_set_key(m.group(0)) for m in re.finditer(_NUMBER_SET, text)]
    found += [_set_key(m.group(0)) for m in re.finditer(_SET_WORDS, text, re.IGNORECASE)]
    return tuple(dict.fromkeys(found))


_FUNCTION_RULE = re.compile(r"[A-Za-z]\s*\(\s*[A-Za-z]\s*\)\s*\)?\s*=")
_DECLARED_PARAMETER = re.compile(
    r"\s*,?\s*(?:\\text\{\s*(?:for some|for any|for all|where) (?:integer|integers)\s*\}\s*([A-Za-z])"
    r"|\\text\{\s*(?:for some|for any|for all|where) (?:integer|integers) ([A-Za-z])\s*\}"
    r"|\\text\{\s*(?:for some|for any|for all|where|with)\s*\}\s*([A-Za-z])\s*\\in\s*\\mathbb\{Z\})\s*$"
)
"""``(-32 + 3t, 64 - 5t) \\text{ for some integer } t``: a family of answers and its parameter."""
_FUNCTION_TUPLE = re.compile(r"^\(\s*((?:[A-Za-z]\s*\(\s*[A-Za-z]\s*\)\s*,\s*)+[A-Za-z]\s*\(\s*[A-Za-z]\s*\))\s*\)\s*=\s*\((.+)\)$")
"""``(f(n), g(n)) = (n, 1)``: several function rules at once."""
_INFINITELY_MANY = {"infinitely many", "infinite", "infinity", "infinitely many solutions"}
_TEXT_AND = re.compile(r"\\text\{([^{}]*?[A-Za-z])\s+and\s*\}")
_SET_MINUS = re.compile(r"^(\\\{.+?\\\})\s*(?:-|\\setminus|\\backslash)\s*\\\{([^{}]+)\\\}$")
MAX_CHAIN = 6
"""Links of an ``=``-chain read to its last value; a longer chain is left as written (each link is parsed)."""
_EQUALS_CHAIN = re.compile(rf"^\s*(?:{_VAR}\s*=\s*)+(?P<value>[^=<>]+)$")
"""``x = y = z = \\frac{\\sqrt2}{2}``: several names for one value."""


def _word_list(text: str) -> str | None:
    """``line segment, circle`` and ``\\text{line segment and circle}``: several word answers, in
    their order (``increasing, decreasing`` may answer two parts in turn); None for anything else."""
    t = _TEXT_WRAP.sub(r"\1", text).strip()
    parts = [q for q in re.split(r"\s*,\s*(?:and\s+)?|\s+and\s+", t) if q]
    if len(parts) < 2 or len(parts) > MAX_ITEMS:
        return None
    words = [_text_answer(q) for q in parts]
    if any(w is None for w in words):
        return None
    return "; ".join(words)


def _chain_value(text: str, strict: bool) -> str:
    """``x = 5 + 5 + 1 = 11`` -> ``11``: an ``=``-chain read to its last value, when every link
    before it is a name (for a response, one `_SAFE_LABEL` allows) or equal to that value
    (``x = 7 = 5`` is no answer); anything else unchanged."""
    links = [q.strip() for q in split_top_level(text, ("=",))] if "=" in text else []
    if not 3 <= len(links) <= MAX_CHAIN or any(not q or _INEQUALITY.search(q) for q in links):
        return text
    value = read_item(links[-1])
    if value.expr is None or value.unit or value.percent or value.degrees:
        return text
    if re.fullmatch(_VAR, links[-1]) and all(re.fullmatch(_VAR, q) for q in links[:-1]):
        return text  # "a = b = c" relates three variables: no value
    for link in links[:-1]:
        if re.fullmatch(_VAR, link) and (not strict or _SAFE_LABEL.match(link)):
            continue
        item = read_item(link)
        if item.expr is None or item.unit or item.percent or item.degrees or not same_item(item, value):
            return text
    return links[-1]


def _conditions(parts: list[str], both: bool = False) -> Basic | None:
    try:
        return _conditions_set(parts, both)
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return None  # "x = \\infty - \\infty": no set of reals


def _conditions_set(parts: list[str], both: bool) -> Basic | None:
    """``4 < m \\le 8 \\text{ or } 10 \\le m < 12``, ``a \\le -2 \\text{ or } a = 1``: one set of
    reals, the union of what each condition on the one variable allows (with `both`, ``x > 1
    \\text{ and } x < 3``: what all of them allow); None otherwise."""
    sets, variables = [], set()
    for part in parts:
        point = re.match(r"^\s*([A-Za-z])\s*=\s*([^=<>]+)$", part)
        expr = read_item(point.group(2) if point else part).expr
        if expr is None:
            return None
        if point:
            if not _is_number(expr) or expr.is_finite is not True or expr.is_real is not True:
                return None
            variables.add(point.group(1))
            sets.append(FiniteSet(expr))
            continue
        converted = _as_set(expr)
        names = _symbol_names(expr)
        if converted is None or len(names) != 1:
            return None
        variables |= names
        sets.append(converted)
    if len(variables) != 1:
        return None
    return sympy.Intersection(*sets) if both else sympy.Union(*sets)


def read(answer: str, choice: bool = True, strict: bool = False, domains: tuple[str, ...] = ()) -> Reading:
    """Read an answer string: choice letter, words, or a list of items.

    >>> [i.raw for i in read("x = 1 or x = 2").items]
    ['1', '2']
    >>> read(r"\\text{(B)}").choice
    'B'
    >>> read("Yes").words
    'yes'
    """
    text = clean_latex(answer)
    reading = Reading(text=text)
    letter = parse_choice(text) if choice else None
    if letter is not None:
        reading.choice = letter
        return reading
    clock = clock_time(text)
    if clock is not None:
        reading.words = clock
        return reading
    listed = _word_list(text)
    if listed is not None:
        reading.words = listed
        return reading
    words = _text_answer(text)
    if words in _INFINITELY_MANY:
        text, words = "\\infty", None  # "infinitely many" is the count infinity
    if words is not None:
        reading.words = words
        return reading
    parameter = _DECLARED_PARAMETER.search(text)
    if parameter:
        reading.parameter = next(g for g in parameter.groups() if g)
        text = text[: parameter.start()].strip()
    if _FUNCTION_RULE.search(text) and domains:
        def domain(m: re.Match) -> str:
            stated = m.group("set") or m.group("words") or m.group("words2")
            return " " if _set_key(stated) in domains else m.group(0)

        text = _RULE_DOMAIN.sub(domain, text).strip()
    rules = _FUNCTION_TUPLE.match(text)
    if rules:
        heads, values = split_top_level(rules.group(1)), split_top_level(rules.group(2))
        if len(heads) == len(values):
            text = ", ".join(f"{h} = {v}" for h, v in zip(heads, values))
    text = _TEXT_AND.sub(r"\\text{\1}, ", text)  # "7 \text{ goats and } 4 \text{ toys}": two values
    text = _chain_value(text, strict)
    minus = _SET_MINUS.match(text)
    if minus:
        whole, removed = read(minus.group(1)), [read_item(q).expr for q in split_top_level(minus.group(2))]
        if len(whole.items) == 1 and _set_like(whole.items[0].expr) is not None and all(_is_number(e) and not _has_float(e) and e.is_finite for e in removed):
            item = Item(raw=text, expr=sympy.Complement(_set_like(whole.items[0].expr), FiniteSet(*removed)))
            reading.items = [item]
            return reading
    builder = _SET_BUILDER.match(text)
    if builder and _INEQUALITY.search(builder.group(2)):
        text = builder.group(2)  # {x | -1 < x < 1} is the interval the condition describes
    member = _MEMBER_OF.match(text)
    if member:
        text = member.group(1)  # "x \in (-6, 10)": the set itself
    body, is_set = _unwrap_set(text)
    body = merge_thousands(body)
    parts = split_top_level(_LIST_WORDS.sub(", ", body) if not is_set else body)
    parts = [q for p in parts if p for q in _expand_pm(p)]
    if len(parts) > MAX_ITEMS:
        reading.items = [Item(raw=p) for p in parts]  # too many to parse: judged on the count
        return reading
    joined_by = set(re.findall(r"\b(or|and)\b", body))
    if len(parts) > 1 and any(_INEQUALITY.search(p) for p in parts) and len(joined_by) == 1:
        # "x < 1 or x > 2" is one set, "x > 1 and x < 3" another: never two answers
        allowed = _conditions(parts, both=joined_by == {"and"})
        if allowed is not None:
            reading.items = [Item(raw=text, expr=allowed)]
            return reading
    if len(parts) > 1 and all(_INEQUALITY.search(p) for p in parts):
        parts = [text]  # "x < 1 or x > 2" is one set, not two answers
    if len(parts) > 1:
        # "x = 1, x = 2" lists roots; "x = 1, y = 2" lists values of different variables
        names = [re.match(r"^\s*([A-Za-z])\s*=", p) for p in parts]
        if all(names) and len({m.group(1) for m in names}) == len(parts):
            reading.items = [read_item(p) for p in parts]  # keep the assignments
        else:
            sequence, extremes = _sequence_values(parts), _extremes(parts)
            if extremes is not None:
                reading.items = extremes
            elif sequence is not None:
                reading.items, reading.ordered = [read_item(q) for q in sequence], True
            else:
                reading.items = [read_item(_strip_var(p, labels=True, strict=strict)) for p in parts]
        return reading
    if is_set:
        reading.items = [read_item(body)]
        return reading
    label = _strip_var(text, labels=True, strict=strict)  # "(p,q) = (3,2)", "|AB| = 1": the value named
    single = re.match(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=", text)  # "x = 3" keeps its own reading
    reading.items = [read_item(label if label != text and not single else text)]
    return reading


# -- comparing ---------------------------------------------------------------------------------


def _too_big(expr) -> bool:
    n = 0
    for _ in sympy.preorder_traversal(expr):
        n += 1
        if n > MAX_NODES:
            return True
    return False


MAX_DIGITS = 10**6
"""Numbers with more digits than this are only equal to what is written the same way."""


def _log10_size(e, depth: int = 0) -> float | None:
    """log10 of |e| for integer powers and factorials without evaluating them; None if unknown.

    >>> _log10_size(sympy.Pow(10, sympy.Pow(10, 10, evaluate=False), evaluate=False))
    10000000000.0
    """
    import math

    if depth > 20:
        return math.inf
    if isinstance(e, (sympy.Integer, sympy.Rational, Float)):
        return math.log10(abs(float(e))) if e != 0 and abs(e) < sympy.Float("1e300") else (-math.inf if e == 0 else 300.0)
    if isinstance(e, sympy.Pow):
        base, exp = _log10_size(e.base, depth + 1), _log10_size(e.exp, depth + 1)
        if base is None or exp is None or (e.exp.is_number and e.exp.is_negative):
            return None
        if exp > 15:
            return math.inf
        return (10**exp) * abs(base)
    if isinstance(e, sympy.factorial):
        n = _log10_size(e.args[0], depth + 1)
        if n is None:
            return None
        return math.inf if n > 12 else (10**n) * max(n, 1.0)
    return None


def _astronomical(e) -> bool:
    """Does `e` contain a number too large to evaluate (a power tower, a huge factorial)?"""
    if not isinstance(e, Basic):
        return False
    for node in sympy.preorder_traversal(e):
        if isinstance(node, (sympy.Pow, sympy.factorial)):
            size = _log10_size(node)
            if size is not None and size > MAX_DIGITS:
                return True
    return False


def _is_number(e) -> bool:
    return isinstance(e, Basic) and not isinstance(e, (Relational, BooleanAtom, sympy.Set, Tuple)) and getattr(e, "is_number", False)


def _numeric(e, digits: int = EXACT_DIGITS):
    v = sympy.N(e, digits)
    return v if v.is_number and v.is_finite is not False else None


def _has_float(e) -> bool:
    return isinstance(e, Basic) and e.has(Float)


def same_number(g, p, gold_decimals: int | None = None) -> bool:
    """Numbers (no variables): exact unless a decimal is involved (see the module docstring)."""
    if g == p:
        return True
    if g.has(sympy.oo, sympy.zoo, sympy.nan) or p.has(sympy.oo, sympy.zoo, sympy.nan):
        return False  # infinities are equal only as written (checked above)
    gv, pv = _numeric(g), _numeric(p)
    if gv is None or pv is None:
        return False
    if not gv.is_real or not pv.is_real:
        gre, gim = gv.as_real_imag()
        pre, pim = pv.as_real_imag()
        if not all(part.is_real is True for part in (gre, gim, pre, pim)):
            return False  # parts that are not plain reals (an undefined or symbolic value)
        return same_number(gre, pre) and same_number(gim, pim)
    diff = abs(gv - pv)
    scale = max(abs(gv), abs(pv))
    if gold_decimals is not None and not _has_float(p) and not _terminating(p):
        # the gold is a decimal rounding of an exact value that has no finite decimal form
        # (3.14 for pi, 0.33 for 1/3): the exact answer must round to it
        return bool(diff < sympy.Rational(1, 2) * sympy.Rational(1, 10**gold_decimals))
    if _has_float(g) or _has_float(p):
        if _has_float(g) and _has_float(p):
            return bool(diff <= scale * sympy.Float("1e-12")) if scale else diff == 0
        return bool(diff <= scale * DECIMAL_REL_TOL) if scale else diff == 0
    return bool(diff <= scale * EXACT_REL_TOL) if scale else diff == 0


def _terminating(e) -> bool:
    """A rational with a finite decimal form (1/4 = 0.25): a decimal gold must equal it exactly."""
    if not isinstance(e, Basic):
        return False
    try:
        r = sympy.nsimplify(e, rational=False) if not e.is_Rational else e
    except (TypeError, ValueError):
        return False
    if not r.is_Rational:
        return False
    q = int(r.q)
    for f in (2, 5):
        while q % f == 0:
            q //= f
    return q == 1


def _symbol_names(e) -> set[str]:
    return {s.name for s in e.free_symbols if isinstance(s, Symbol)}


def same_expression(g, p) -> bool:
    """Expressions with variables: the same variables, and equal at random points."""
    if g == p:
        return True
    gn, pn = _symbol_names(g), _symbol_names(p)
    if gn != pn:
        only_g, only_p = gn - pn, pn - gn
        if len(only_g) == 1 == len(only_p):
            a, b = next(iter(only_g)), next(iter(only_p))
            if a in PARAMETER_LETTERS and b in PARAMETER_LETTERS and _period_parameter(g, a) and _period_parameter(p, b):  # pi/6 + k pi is pi/6 + n pi
                return same_expression(g, rename(p, b, a))
        return False
    diff = g - p
    symbols = sorted(diff.free_symbols, key=lambda s: s.name)
    rng = random.Random(0)
    tol = sympy.Float("1e-10") if _has_float(g) or _has_float(p) else sympy.Float("1e-20")
    tried = agreed = 0
    for _ in range(12):
        point = {s: sympy.Rational(rng.randint(31, 271), 100) for s in symbols}
        gv = _numeric(g.subs(point), 30)
        pv = _numeric(p.subs(point), 30)
        if gv is None or pv is None:
            continue
        tried += 1
        scale = max(abs(gv), abs(pv), 1)
        if abs(gv - pv) > scale * tol:
            return False
        agreed += 1
        if agreed >= 5:
            return True
    if tried == 0:
        return sympy.simplify(diff) == 0
    return agreed == tried


def _assignment(e) -> tuple[str, Basic] | None:
    """``x = 5`` -> ("x", 5): a plain variable (one letter, maybe with a subscript: not a word such
    as ``\text{radius}``, whose meaning depends on the question) set to something that does not contain it."""
    if (
        isinstance(e, Eq) and isinstance(e.lhs, Symbol) and _PLAIN_VARIABLE.match(e.lhs.name)
        and e.lhs not in getattr(e.rhs, "free_symbols", set())
    ):
        return e.lhs.name, e.rhs
    return None


_PLAIN_VARIABLE = re.compile(
    r"^(?:[A-Za-z]|alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|tau|"
    r"upsilon|phi|varphi|chi|psi|omega)(?:_.+)?$",
    re.IGNORECASE,
)
"""``x``, ``y_1``, ``\theta``: a symbol that names an unknown, not a word."""


def _as_set(e):
    """A univariate inequality (or ``x \\in S``) as a set of reals; None if it is not one."""
    if isinstance(e, Eq) and isinstance(e.lhs, Symbol) and isinstance(e.rhs, sympy.Set):
        return e.rhs
    if isinstance(e, (Relational, And, Or)) and not isinstance(e, Eq):
        free = e.free_symbols
        if len(free) == 1:
            direct = _bounds_as_set(e)
            if direct is not None:
                return direct
            try:
                return e.as_set()
            except (NotImplementedError, TypeError, ValueError):
                return None
    if isinstance(e, FiniteSet) and e.args and all(isinstance(a, Relational) and not isinstance(a, Eq) for a in e.args):
        return _as_set(Or(*e.args))  # "x < 1 or x > 2" comes back from the parser as a set
    return None


_HALF_LINE = {"<": (True, True), "<=": (True, False), ">": (True, True), ">=": (False, True)}


def _bounds_as_set(e):
    """``x < 3``, ``2 <= x``, and ``And``/``Or`` of such bounds on one variable, as a set of
    reals built directly: what ``e.as_set()`` returns for them (the test checks it), without
    sympy's general inequality solver (≈ 0.1 s a call). None for anything else.

    >>> _bounds_as_set(sympy.And(sympy.Symbol("x") > 1, sympy.Symbol("x") <= 3))
    Interval.Lopen(1, 3)
    """
    if isinstance(e, (And, Or)):
        parts = [_bounds_as_set(a) for a in e.args]
        if any(p is None for p in parts):
            return None
        return sympy.Intersection(*parts) if isinstance(e, And) else sympy.Union(*parts)
    if not isinstance(e, Relational) or e.rel_op not in _HALF_LINE:
        return None
    op, var, bound = e.rel_op, e.lhs, e.rhs
    if not isinstance(var, Symbol):
        op, var, bound = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op], e.rhs, e.lhs  # 2 < x is x > 2
    if not isinstance(var, Symbol) or not _is_number(bound) or bound.is_real is not True or bound.is_finite is not True:
        return None  # an infinite, complex or undefined bound is left to sympy
    left_open, right_open = _HALF_LINE[op]
    if op in ("<", "<="):
        return Interval(-sympy.oo, bound, left_open, right_open)
    return Interval(bound, sympy.oo, left_open, right_open)


def same_equation(g: Eq, p: Eq) -> bool:
    """Two equations are the same when one side-difference is a nonzero constant multiple of the other."""
    dg, dp = g.lhs - g.rhs, p.lhs - p.rhs
    if _symbol_names(dg) != _symbol_names(dp) or not dg.free_symbols:
        return False
    ratio = sympy.simplify(dg / dp)
    return bool(ratio.is_number and ratio != 0 and ratio.is_finite)


def _is_expression(e) -> bool:
    return isinstance(e, Basic) and not isinstance(e, (Relational, BooleanAtom, sympy.Set, Tuple, And, Or)) and not isinstance(e, MatrixBase)


def solved_for(g: Eq, p) -> bool:
    """An equation gold answered by an expression: the expression is the value of the one
    variable of the gold's left side it does not use (``xy = 6`` answered ``6/x`` is ``y = 6/x``),
    and the gold solved for that variable has exactly that one solution. ``x^2 - 4 = 0`` is
    not ``2`` (two solutions) and ``a - b = 0`` is not ``0`` (two variables missing); only an
    equation linear in that variable is solved (``\\tan x = 1`` is not ``\\pi/4``)."""
    p_symbols = _symbol_names(p)
    missing = [v for v in g.lhs.free_symbols if isinstance(v, Symbol) and v.name not in p_symbols]
    if len(missing) != 1 or not p_symbols <= _symbol_names(g) or _too_big(g) or _too_big(p):
        return False
    v, d = missing[0], g.lhs - g.rhs
    try:
        if not d.is_polynomial(v) or sympy.degree(d, v) != 1:
            return False  # only an equation linear in it has one solution for it, whatever the others are
        slope = sympy.expand(d).coeff(v, 1)
        if slope == 0:
            return False
        solution = -(d - slope * v) / slope
    except (NotImplementedError, TypeError, ValueError, sympy.PolynomialError):
        return False
    return _is_expression(solution) and same_value(sympy.expand(solution), p)


_FLIPPED = {">": "<", ">=": "<="}


def _relations(e) -> list[tuple[str, Basic, Basic]] | None:
    """A comparison or a chain of them (``a > b > c`` parses as ``And``), as (op, left, right)
    with ``>`` turned into ``<``; None when `e` is anything else."""
    parts = e.args if isinstance(e, And) else (e,)
    out = []
    for r in parts:
        if not isinstance(r, Relational) or isinstance(r, Eq) or r.rel_op not in ("<", "<=", ">", ">=", "!="):
            return None
        op, left, right = r.rel_op, r.lhs, r.rhs
        if op in _FLIPPED:
            op, left, right = _FLIPPED[op], right, left
        out.append((op, left, right))
    return out


def same_relations(g, p) -> bool:
    """The same comparisons, side by side (each side the same value; ``a > b`` is ``b < a``)."""
    gr, pr = _relations(g), _relations(p)

    def same(a, b) -> bool:
        if a[0] != b[0]:
            return False
        if a[0] == "!=" and same_value(a[1], b[2]) and same_value(a[2], b[1]):
            return True
        return same_value(a[1], b[1]) and same_value(a[2], b[2])

    return match_all(gr, pr, ordered=False, compare=same)


def rename(e, old: str, new: str):
    """`e` with the variable named `old` called `new` (its assumptions kept)."""
    return e.subs({v: Symbol(new, **v.assumptions0) for v in e.free_symbols if getattr(v, "name", "") == old})


PARAMETER_LETTERS = frozenset("knmjl")
"""The letters of an integer parameter (``k\\pi``, ``2n\\pi``): only these are renamed."""


def _linear_in(e, name: str) -> bool:
    """Is `e` a polynomial of degree at most 1 in the variable named `name`?"""
    v = next((s for s in getattr(e, "free_symbols", ()) if getattr(s, "name", "") == name), None)
    try:
        return v is None or (e.is_polynomial(v) and sympy.degree(e, v) <= 1)
    except (TypeError, ValueError, sympy.PolynomialError):
        return False


def _period_parameter(e, name: str) -> bool:
    """Does the variable `name` enter `e` only as a whole number of periods (``+ k\\pi``,
    ``+ 2n\\pi``): the integer parameter of a family of solutions, whatever its letter?"""
    v = next((s for s in e.free_symbols if getattr(s, "name", "") == name), None)
    if v is None or not isinstance(e, Basic) or not e.is_polynomial(v) or sympy.degree(e, v) != 1:
        return False
    coefficient = (e.coeff(v) / sympy.pi)
    return coefficient.is_rational is True and coefficient != 0


def same_set(g, p) -> bool:
    if isinstance(g, FiniteSet) and isinstance(p, FiniteSet):
        return match_all(list(g.args), list(p.args), ordered=False)
    if isinstance(g, Interval) and isinstance(p, Interval):
        return (
            g.left_open == p.left_open
            and g.right_open == p.right_open
            and same_value(g.start, p.start)
            and same_value(g.end, p.end)
        )
    if isinstance(g, Union) and isinstance(p, Union):
        return match_all(list(g.args), list(p.args), ordered=False)
    return g == p


def _as_sequence(e) -> list | None:
    if isinstance(e, Tuple):
        return list(e.args)
    if isinstance(e, MatrixBase) and (e.rows == 1 or e.cols == 1):
        return list(e)
    if isinstance(e, Interval) and e.left_open and e.right_open:
        return [e.start, e.end]  # "(1, 3)" reads as an interval, but may be a point
    return None


def _set_like(e):
    """`e` as a set of reals when it is a set or a univariate inequality; else None."""
    converted = _as_set(e)
    if converted is not None:
        return converted
    return e if isinstance(e, sympy.Set) else None


def same_value(g, p, gold_decimals: int | None = None) -> bool:
    """Are two parsed values (sympy objects) the same mathematical object? See the module docstring."""
    if g is None or p is None:
        return False
    ga, pa = _assignment(g), _assignment(p)
    if ga and pa:
        return ga[0] == pa[0] and same_value(ga[1], pa[1], gold_decimals)
    if ga and not isinstance(p, Relational):
        return same_value(ga[1], p, gold_decimals)
    if pa and not isinstance(g, Relational):
        return same_value(g, pa[1], gold_decimals)
    if isinstance(g, Eq) and isinstance(p, Eq):
        return same_equation(g, p)
    if isinstance(g, Eq) and _is_expression(p):
        return solved_for(g, p)  # "y + 1 = -(2x-1)^2" answered "-4x^2 + 4x - 2"
    if isinstance(g, Eq) or isinstance(p, Eq):
        return False  # an equation never collapses to a value
    gq, pq = _as_sequence(g), _as_sequence(p)
    if gq is not None and pq is not None and not (isinstance(g, Interval) and isinstance(p, Interval)):
        return match_all(gq, pq, ordered=True)  # points, tuples, vectors
    gs, ps = _set_like(g), _set_like(p)
    if gs is not None and ps is not None:
        return same_set(gs, ps)
    if gs is None and ps is None and _relations(g) and _relations(p):
        return same_relations(g, p)  # "f(-3/4) >= f(a^2-a+1)", "tan 7pi/5 > sin 2pi/5 > cos 6pi/5"
    if gs is not None or ps is not None or isinstance(g, (Relational, And, Or)) or isinstance(p, (Relational, And, Or)):
        return False
    if isinstance(g, MatrixBase) or isinstance(p, MatrixBase):
        return isinstance(g, MatrixBase) and isinstance(p, MatrixBase) and g.shape == p.shape and match_all(list(g), list(p), ordered=True)
    if isinstance(g, Tuple) or isinstance(p, Tuple):
        return False
    if _too_big(g) or _too_big(p):
        return False
    if _astronomical(g) or _astronomical(p):
        return g == p  # only the same expression; evaluating it could take forever
    if _is_number(g) and _is_number(p):
        return same_number(g, p, gold_decimals)
    if _is_number(g) != _is_number(p):
        return False
    return same_expression(g, p)


def match_all(golds: list, preds: list, ordered: bool, compare=None) -> bool:
    """Equal lengths and every gold matched to its own prediction (in order, or one-to-one)."""
    compare = compare or same_value
    if len(golds) != len(preds):
        return False
    if ordered:
        return all(compare(g, p) for g, p in zip(golds, preds))
    left = list(preds)
    for g in golds:
        for k, p in enumerate(left):
            if compare(g, p):
                del left[k]
                break
        else:
            return False
    return True


# -- items: units, percentages, degrees ---------------------------------------------------------


def _rational(f: Fraction) -> sympy.Rational:
    return sympy.Rational(f.numerator, f.denominator)


def _value_of(e):
    """The value of ``x = 5`` is 5; anything else is its own value."""
    a = _assignment(e)
    return a[1] if a else e


def same_item(g: Item, p: Item) -> bool:
    """Compare two answers after reconciling units, percent signs and degree marks."""
    ge, pe = g.expr, p.expr
    if ge is None or pe is None:
        return False
    if g.head and p.head:
        if g.head[0] != p.head[0]:
            return False  # the rule of another function (P(x) = ... for Q(x) = ...)
        if g.head[1] != p.head[1]:  # f(z) = z is the rule f(x) = x
            pe = rename(pe, p.head[1], g.head[1])
    elif g.head or p.head:  # one side names the function: its variable is its own (x(t) = e^t for e^t) or x (f(y) = y^2 for x^2)
        if _same_plain(g, p):
            return True
        named = g if g.head else p
        if "x" in named.head:  # already in x, or the function is named x (x(t) = e^t is not e^x)
            return False
        renamed = rename(named.expr, named.head[1], "x")
        ge, pe = (renamed, pe) if named is g else (ge, renamed)
    if g.unit and p.unit:
        if g.unit.dimension != p.unit.dimension:
            return False
        if g.unit.factor == p.unit.factor:
            return same_value(ge, pe, g.decimals)
        ge, pe = _value_of(ge), _value_of(pe)
        if isinstance(ge, Relational) or isinstance(pe, Relational):
            return False
        return same_value(ge * _rational(g.unit.factor), pe * _rational(p.unit.factor))
    if g.percent != p.percent:
        base, other = (g, p) if g.percent else (p, g)
        # 50% equals 50 and 0.5 (the percent sign may be dropped, or the value written as a fraction)
        if same_value(base.expr, other.expr, g.decimals if g is base else None):
            return True
        if base is g:  # 6.67% fixes four decimals of 1/15 (a gold of two significant digits or more)
            digits = re.search(r"(\d*)\.(\d+)", g.raw)
            significant = len((digits.group(1) + digits.group(2)).lstrip("0")) if digits else 0
            return same_value(ge / 100, pe, g.decimals + 2 if g.decimals is not None and significant >= 2 else None)
        return same_value(ge, pe / 100, g.decimals)
    if g.degrees != p.degrees:
        deg, other = (g, p) if g.degrees else (p, g)
        if other.expr.has(sympy.pi):  # radians, stated with pi
            converted = deg.expr * sympy.pi / 180
            return same_value(converted, other.expr) if deg is p else same_value(other.expr, converted)
        return same_value(ge, pe, g.decimals)
    return same_value(ge, pe, g.decimals)


def _same_plain(g: Item, p: Item) -> bool:
    """`same_item` of two items as written, without their function heads."""
    return same_item(Item(raw=g.raw, expr=g.expr, unit=g.unit, percent=g.percent, degrees=g.degrees, decimals=g.decimals),
                     Item(raw=p.raw, expr=p.expr, unit=p.unit, percent=p.percent, degrees=p.degrees, decimals=p.decimals))


def equivalent(gold: str, answer: str, choices: dict[str, str] | None = None, domains: tuple[str, ...] = ()) -> Judgement:
    """Is `answer` equivalent to `gold`? `choices` maps option letters to option texts, if known.
    Cached (`CACHE_SIZE`) by the three inputs.

    >>> equivalent(r"\\frac{1}{2}", "0.5").equal
    True
    >>> equivalent(r"\\frac{1}{2^{98}}", r"\\frac{1}{2^{99}}").equal
    False
    >>> equivalent("10 cm", r"10\\text{ m}").equal
    False
    >>> equivalent("1, 2", r"2 \\text{ or } 1").equal
    True
    >>> equivalent("2", r"2, 3").equal
    False
    >>> equivalent("B", r"\\frac12", {"A": "2", "B": r"\\frac{1}{2}"}).equal
    True
    """
    return _equivalent(gold, answer, tuple(sorted(choices.items())) if choices else (), tuple(domains))


@functools.lru_cache(maxsize=CACHE_SIZE)
def _equivalent(gold: str, answer: str, options: tuple[tuple[str, str], ...], domains: tuple[str, ...] = ()) -> Judgement:
    choices = dict(options) or None
    g, p = read(gold, domains=domains), read(answer, strict=True, domains=domains)  # the gold is the data's; the answer is the policy's
    if g.text == p.text:
        return Judgement(True, "same text")
    named = _EQUALS_CHAIN.match(g.text)
    if named and "=" not in p.text and not g.words:
        value = named.group("value").strip()
        names = [q.strip() for q in split_top_level(g.text, ("=",))[:-1]]
        relation = re.fullmatch(_VAR, value) and not (len(names) == 1 and names[0].lower() == value.lower())
        if not relation:  # "x = y = z" relates variables; "N = n" names its value n (the parser reads both as n)
            g = read(value)
    if p.choice and not g.choice and p.choice not in (choices or {}):
        p = read(answer, choice=False, strict=True)  # a lone letter is a value here (e, or a variable)
    if g.choice or p.choice:
        return _judge_choice(g, p, choices or {})
    if g.words or p.words:
        ok = g.words is not None and (g.words == p.words or g.words == _plain_words(p.text))
        return Judgement(ok, "same words" if ok else "different words")
    if len(p.items) > 1 and len(g.items) == 1 and _as_sequence(g.items[0].expr) is not None:
        point = _point_from_assignments(p.items)  # "x = 2, y = -3" for the point (2, -3)
        if point is not None:
            ok = same_value(g.items[0].expr, point)
            return Judgement(ok, "the point's coordinates" if ok else "other coordinates")
    if p.parameter:  # "(3t, 5t) for some integer t" for the gold's "(3x, 5x)"
        g_names = {n for i in g.items if i.expr is not None for n in _symbol_names(i.expr)}
        p_names = {n for i in p.items if i.expr is not None for n in _symbol_names(i.expr)}
        target = next(iter(g_names - p_names)) if len(g_names - p_names) == 1 else None
        linear = target is not None and all(
            i.expr is not None and all(_linear_in(part, target) for part in (_as_sequence(i.expr) or [i.expr])) for i in g.items
        )
        if p.parameter in p_names and linear:  # a family linear in its parameter ((3x, 5x)); (x, x^2) is a curve
            for i in p.items:
                i.expr = rename(i.expr, p.parameter, target) if i.expr is not None else None
    plain = all(i.expr is not None and _assignment(i.expr) is None and not isinstance(i.expr, Relational) for i in g.items)
    if p.ordered and plain and len(p.items) == len(g.items):
        ok = all(same_item(gi, pi) for gi, pi in zip(g.items, p.items))
        return Judgement(ok, "the values in order" if ok else "other values")
    values = _as_sequence(p.items[0].expr) if len(g.items) > 1 and len(p.items) == 1 else None
    if values is not None and len(values) == len(g.items) and ((plain and isinstance(p.items[0].expr, Tuple)) or all(i.head for i in g.items)):
        # "(x, y, z) = (1, 2, 3)" for the list "1, 2, 3", "(2x, 1)" for "P(x) = 2x, Q(x) = 1": in the gold's order
        if all(i.expr is not None for i in g.items):
            ok = all(same_item(gi, Item(raw="", expr=pe)) for gi, pe in zip(g.items, values))
            return Judgement(ok, "the values in order" if ok else "other values")
    if len(g.items) != len(p.items):
        return Judgement(False, f"{len(p.items)} answers given, {len(g.items)} expected")
    if any(i.expr is None for i in g.items):
        return Judgement(False, "the gold answer does not parse")
    if any(i.expr is None for i in p.items):
        return Judgement(False, "the answer does not parse")
    ok = match_all(g.items, p.items, ordered=False, compare=same_item)
    return Judgement(ok, "equivalent" if ok else "not equivalent")


def _point_from_assignments(items: list[Item]) -> Tuple | None:
    pairs = [_assignment(i.expr) for i in items]
    if not all(pairs) or len({name for name, _ in pairs}) != len(pairs):
        return None
    return Tuple(*(value for _, value in sorted(pairs, key=lambda nv: nv[0])))


def _judge_choice(g: Reading, p: Reading, choices: dict[str, str]) -> Judgement:
    p_letter = (p.choice or parse_choice(p.text, allow_text=True)) if g.choice else p.choice
    if g.choice and p_letter:
        ok = g.choice == p_letter
        return Judgement(ok, "same option" if ok else "another option")
    if g.choice and g.choice in choices:
        # the answer gives the option's text instead of its letter
        ok = equivalent(choices[g.choice], p.text).equal
        if ok:
            others = [k for k, v in choices.items() if k != g.choice and equivalent(v, p.text).equal]
            ok = not others
        return Judgement(ok, "the option's text" if ok else "not the option's text")
    if p.choice and p.choice in choices:
        ok = equivalent(g.text, choices[p.choice]).equal
        return Judgement(ok, "the option with the gold text" if ok else "an option with another text")
    return Judgement(False, "option letter without the options to resolve it")
