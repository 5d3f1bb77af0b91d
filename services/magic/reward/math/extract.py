"""Finding the final answer in a response, and reading answer strings (pure string functions).

Everything here runs in the trusted reward process on untrusted text, so every function is
linear in its input: no backtracking regular expressions over the whole response, no parsing of
more than the last few thousand characters.

* `answer_region` — the text after the reasoning (after the last ``</think>``).
* `extract_answer` — the last ``\\boxed{...}`` (or ``\\fbox{...}``) in it; without one, an
  explicit final-answer statement ("The final answer is 5", "Answer: 5") at the very end.
* `clean_latex`, `merge_thousands`, `split_top_level` — conservative normalisation of an
  answer string before it is parsed (see `magic.reward.math.equiv`).
* `parse_choice`, `parse_choices` — multiple-choice letters and the options of a problem.
"""

from __future__ import annotations

import re

BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_TAIL_CHARS = 2000  # the fallback looks for "answer is ..." only this close to the end


def answer_region(response: str) -> str | None:
    """The part of `response` after the reasoning: after the last ``</think>``.

    A response that opened ``<think>`` but never closed it has no answer yet (None).

    >>> answer_region("<think>try 3</think> so 4")
    ' so 4'
    >>> answer_region("no reasoning tags: 4")
    'no reasoning tags: 4'
    >>> answer_region("<think>still thinking") is None
    True
    """
    end = response.rfind("</think>")
    if end >= 0:
        return response[end + len("</think>") :]
    if "<think>" in response:
        return None
    return response


def _braced(text: str, open_pos: int) -> int | None:
    """Index just past the brace group opening at `text[open_pos] == '{'`; None if it never closes."""
    depth = 0
    j = open_pos
    while j < len(text):
        c = text[j]
        if c == "\\" and j + 1 < len(text) and text[j + 1] in "{}":
            j += 2  # an escaped brace (\{ or \}) is a character, not a group
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _box_at(text: str, start: int) -> tuple[str, int] | None:
    """The box command at `start`: (its content, the index just past it); None if malformed."""
    cmd = next((c for c in BOX_COMMANDS if text.startswith(c, start)), None)
    if cmd is None:
        return None
    i = start + len(cmd)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _braced(text, i)
        return None if end is None else (text[i + 1 : end - 1], end)
    if i > start + len(cmd):  # "\boxed 5": the next token
        m = re.match(r"[^\s$.,;]+", text[i : i + 200])
        return (m.group(0), i + m.end()) if m else None
    return None


def _last_box_start(text: str, end: int) -> int:
    return max(text.rfind(cmd, 0, end) for cmd in BOX_COMMANDS)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``); None if none closes.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and finally \\boxed{3}")
    '3'
    >>> last_boxed(r"\\boxed{\\{1, 2\\}}")
    '\\\\{1, 2\\\\}'
    >>> last_boxed(r"\\boxed 7.")
    '7'
    >>> last_boxed(r"\\boxed{17") is None
    True
    """
    start = _last_box_start(text, len(text))
    if start < 0:
        return None
    box = _box_at(text, start)
    return box[0] if box else None


_SEPARATOR_NOISE = re.compile(r"\\(?:text|mathrm|textbf)\b|\\q?quad\b|\\[,;:! ()\[\]]|[\s$,;.&{}()]")


def joins_boxes(between: str) -> bool:
    """Whether the text between two boxes makes them one answer: punctuation, math delimiters
    and spacing only, or "and"/"or" with at most three other words around it
    (``\\quad \\text{and} \\quad``, ``\\text{ for part (a) and }``, ``papers and``) — not a
    sentence that moves on (``. So``, ``wait``).

    >>> joins_boxes("$ and $"), joins_boxes(r" \\text{ for part (a) and } "), joins_boxes(". So $")
    (True, True, False)
    """
    if len(between) > 80:
        return False
    words = re.findall(r"[A-Za-z]+", _SEPARATOR_NOISE.sub(" ", between))
    return not words or (len(words) <= 4 and any(w.lower() in ("and", "or") for w in words))


def trailing_boxes(text: str, limit: int = 64) -> list[str]:
    """The last boxed answer, with the boxes just before it when only "and", "or" or commas
    separate them (``\\boxed{2} and \\boxed{3}`` states two answers); at most `limit`.

    >>> trailing_boxes(r"try \\boxed{1}. So $\\boxed{2}$ and $\\boxed{3}$.")
    ['2', '3']
    >>> trailing_boxes("none")
    []
    """
    out: list[str] = []
    end = len(text)
    next_start = None
    while len(out) < limit:
        start = _last_box_start(text, end)
        if start < 0:
            break
        box = _box_at(text, start)
        if box is None:
            break
        content, box_end = box
        if next_start is not None and (box_end > next_start or not joins_boxes(text[box_end:next_start])):
            break  # nested in the later box, or separated from it by more than "and"
        out.append(content)
        next_start = end = start
    return out[::-1]


_FINAL_ANSWER = re.compile(
    r"(?:final answer|the answer)\s*(?:is|:)\s*:?\s*(?P<a>[^\n]{1,300}?)\s*\.?\s*$|^\s*\**\s*(?:final\s+)?answer\s*\**\s*:\s*\**\s*(?P<b>[^\n]{1,300}?)\s*\.?\s*$",
    re.IGNORECASE | re.MULTILINE,
)


_GSM8K_ANSWER = re.compile(r"(?:^|\n)\s*####\s*([^\n]{1,300}?)\s*$")
"""GSM8K's (and verl's gsm8k reward's) answer line, ending the response: ``#### 72``."""


_CLOSING = re.compile(
    r"(?:I hope (?:it|this) is correct|I hope (?:this|that|it) helps|Hope (?:this|that|it) helps)[.!]?$"
    r"|<\|(?:im_end|endoftext|eot_id|im_start)\|>(?:user|assistant)?$|</s>$",
    re.IGNORECASE,
)
"""One closing remark or end-of-turn token ending a text: what follows a final answer (the MATH
few-shot format ends "Final Answer: The final answer is $28$. I hope it is correct.")."""
_CLOSING_MAX_CHARS = 32
"""More than the longest text `_CLOSING` matches (``I hope this is correct.``: 23 characters)."""


_LONG_SPACE = re.compile(r"\s{5,}")


def squeeze_space(text: str) -> str:
    """`text` with each run of more than four white-space characters shortened to a paragraph
    break (when it holds a line break) or one space.

    The answer-statement patterns (`_FINAL_ANSWER`, `_GSM8K_ANSWER`) allow white space in several
    adjacent places, so over a long run of it a backtracking match takes time cubic in the run's
    length: 2,000 line breaks (a degenerate policy's output) took minutes. A run of at most four
    bounds that, and the statement reads the same.

    >>> squeeze_space("The answer is" + " " * 9 + "7"), squeeze_space("a\\n" + "\\n" * 9 + "Answer: 7")
    ('The answer is 7', 'a\\n\\nAnswer: 7')
    """
    return _LONG_SPACE.sub(lambda m: "\n\n" if "\n" in m.group() else " ", text)


def strip_closing(text: str) -> str:
    """`text` without the closing remarks and end-of-turn tokens that end it (with the white
    space around them); unchanged when none ends it.

    Read from the end, one remark at a time (the longest that ends the text), so its cost is the
    remarks' length, not the text's: a regex searched over the whole text tried every position
    (≈ 16 ms for a 20 kB chain of thought cut at T, the slowest part of scoring it; quadratic over
    a run of white space).

    >>> strip_closing("The final answer is $28$. I hope it is correct.<|im_end|>")
    'The final answer is $28$.'
    """
    end, cut = len(text), False
    while True:
        while end and text[end - 1].isspace():
            end -= 1
        m = _CLOSING.search(text, max(0, end - _CLOSING_MAX_CHARS), end)
        if m is None:
            return text[:end] if cut else text
        end, cut = m.start(), True


_MATH_SPAN = re.compile(r"\$\$(?P<a>[^$]+?)\$\$|\\\[(?P<b>.+?)\\\]|\\\((?P<c>[^\n]+?)\\\)|\$(?P<d>[^$\n]+?)\$", re.DOTALL)
"""Display math (may span lines) and inline math (may not)."""
_HEDGE = re.compile(
    r"\b(?:not sure|unsure|maybe|perhaps|probably|possibly|might|could be|I think|I believe|guess|unknown|cannot|can't|no answer|none|either)\b|\?",
    re.IGNORECASE,
)
UNMARKED_MAX_CHARS = 80
"""A response with no box and no answer statement is read as an answer only when it is this
short: a bare answer ("7,425,000", "$\\frac{1}{3}$ meters", "Answer: 9"), never a chain of
thought whose last formula may be an intermediate step."""


def unmarked_answer(region: str) -> str | None:
    """The answer of a short response that only states it, read as a final-answer statement is
    (`_stated_value`): the whole text, its math delimiters dropped — never its last number or its
    last formula, so that a hedge, a negation, several candidates, a comparison or a word that
    changes the value (``It is not 6``, ``$5$ or $6$``, ``at least 5``, ``5 squared``) stays what
    it says and the equivalence refuses it. None when the response is long, hedges, or says nothing.

    >>> unmarked_answer("Answer $ 9 $"), unmarked_answer("The volume is $120$."), unmarked_answer("It is not 6.")
    ('9', '120', 'not 6')
    >>> unmarked_answer("28 percent"), unmarked_answer("E"), unmarked_answer("maybe 3?") is None
    ('28 percent', 'E', True)
    """
    text = strip_closing(region).strip()
    if not text or len(text) > UNMARKED_MAX_CHARS or "\n" in _MATH_SPAN.sub(" ", text) or _HEDGE.search(text):
        return None  # long, several lines of prose (a chain of thought cut off), or hedging
    text = _MATH_SPAN.sub(lambda m: next(g for g in m.groups() if g is not None).strip(), text)
    text = re.sub(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?\s*", "", text, flags=re.IGNORECASE).strip().rstrip(".").strip()
    text = re.sub(r"^(?:so|thus|hence|therefore|total|result|in total)\b[,:]?\s*", "", text, flags=re.IGNORECASE).strip()
    return _stated_value(text).strip() or None


_STATED = re.compile(r"^(?P<subject>(?:[A-Za-z$][^.!?]*?\s)?)(?:is|are|equals|was|would be|will be|has|have|gets|got)\s+(?:approximately\s+|about\s+)?(?P<value>[^\s].*?)\s*\.?$", re.IGNORECASE)


def _stated_value(statement: str) -> str:
    """The value a final-answer statement states: ``The volume of $ABCDEFGH$ is 120`` -> 120;
    a statement that is only the value is returned as it is.

    >>> _stated_value("The largest $n$ is 34"), _stated_value("$12$"), _stated_value("Jane started growing Sphere 3 hours ago")
    ('34', '$12$', 'Jane started growing Sphere 3 hours ago')
    """
    m = _STATED.match(statement)
    if m and len(re.findall(r"[A-Za-z]{2,}", m.group("subject"))) >= 1 and not re.search(r"\b(?:is|are)\b", m.group("value")):
        return m.group("value")
    return statement


def extract_answer(response: str) -> str | None:
    """The final answer of a response: the last boxed expression after the reasoning, else a
    GSM8K answer line (``#### 72``) or an explicit final-answer statement ending the response
    (closing remarks aside), else the answer of a short response that only states it
    (`unmarked_answer`); None when there is none.

    >>> extract_answer("<think>maybe \\\\boxed{3}</think> so \\\\boxed{4}")
    '4'
    >>> extract_answer("Adding them gives 12.\\nThe final answer is $12$. I hope it is correct.")
    '12'
    >>> extract_answer("<think>\\\\boxed{17}</think> I am not sure") is None
    True
    >>> extract_answer("3 + 4 = 7 bags, so 72 in all.\\n#### 72")
    '72'
    """
    region = answer_region(response)
    if region is None:
        return None
    boxes = trailing_boxes(region)
    if boxes:
        return ", ".join(b.strip() for b in boxes)
    tail = squeeze_space(strip_closing(region[-_ANSWER_TAIL_CHARS:]).rstrip())
    gsm8k = _GSM8K_ANSWER.search(tail)
    if gsm8k:
        return gsm8k.group(1).strip().strip("$").strip() or None
    last = None
    for m in _FINAL_ANSWER.finditer(tail):
        last = m
    if last is not None and not tail[last.end() :].strip():
        answer = _stated_value((last.group("a") or last.group("b") or "").strip()).strip("$").strip()
        return answer or None
    if any(command in region for command in BOX_COMMANDS):
        return None  # a box that does not close (or hides in another): the answer was cut off
    return unmarked_answer(region)


# -- normalisation ------------------------------------------------------------------------------

_LATEX_NOISE = [
    ("\\displaystyle", ""),
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\cfrac", "\\frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("\\!", ""),
    ("\\,", " "),
    ("\\;", " "),
    ("\\:", " "),
    ("\\ ", " "),
    ("\\quad", " "),
    ("\\qquad", " "),
    ("~", " "),
    ("\\mbox", "\\text"),
    ("\\textnormal", "\\text"),
    ("\\textrm", "\\text"),
    ("{,}", ","),
    ("\u2212", "-"),  # unicode minus
    # Unicode mathematics, as models and datasets write it: the LaTeX it stands for
    ("\u221e", "\\infty "),  # ∞
    ("\u222a", "\\cup "),  # ∪
    ("\u2229", "\\cap "),  # ∩
    ("\u2264", "\\le "),  # ≤
    ("\u2265", "\\ge "),  # ≥
    ("\u2260", "\\ne "),  # ≠
    ("\u2208", "\\in "),  # ∈
    ("\u2205", "\\emptyset "),  # ∅
    ("\u03c0", "\\pi "),  # π
    ("\u00d7", "\\times "),  # ×
    ("\u22c5", "\\cdot "),  # ⋅
    ("\u00b7", "\\cdot "),  # ·
    ("\u211d", "\\mathbb{R}"),  # ℝ
    ("\\leqslant", "\\le "),
    ("\\geqslant", "\\ge "),
    ("\uff1e", ">"),  # ＞ (full width)
    ("\uff1c", "<"),  # ＜
]
_SIZING = re.compile(r"\\(?:big|Big|bigg|Bigg)[lrm]?(?![A-Za-z])")
"""``\\Big\\{``, ``\\bigg(``: the size of a bracket, never its meaning."""
_TEXT_FUNCTION = re.compile(r"\\(?:text|mathrm|operatorname)\{\s*(sin|cos|tan|cot|sec|csc|ln|log|exp)\s*\}")
"""``\\text{sin}`` is ``\\sin``."""
_UNBRACED_FRAC = re.compile(r"\\frac\s*(\{(?:[^{}]|\{[^{}]*\})*\})\s*([A-Za-z0-9])")
"""``\\frac{1+a}c``: a one-character denominator without braces, as TeX allows."""
_ORDINAL = re.compile(
    r"(?<![\w.])(\d+)\s*(?:\^\s*\{\s*(?:\\(?:text|mathrm)\{\s*)?(st|nd|rd|th)\s*\}?\s*\}|\^\s*(st|nd|rd|th)\b|\\(?:text|mathrm)\{\s*(st|nd|rd|th)\s*\}|(st|nd|rd|th)\b)"
    r"(?=\s*(?:\\text\{\s*)?(?:day|days|week|weeks|month|months|year|years|term|terms|place|row|column|floor|step|round|century)?\s*\}?\s*$)",
    re.IGNORECASE,
)
"""An ordinal that ends the answer, alone or with the kind of place it counts (``15th Day``): its
number. Followed by anything else (``3rd \\text{ from the right}``, ``3rd \\text{ smallest}``) it is
left as written."""
_CIRCLED = {chr(0x2460 + k): str(k + 1) for k in range(20)}  # ① .. ⑳, the numbered statements of a question


def _ordinal(m: re.Match) -> str:
    """``12^{\\mathrm{th}}``, ``15th``, ``2nd``: the number, when the suffix is the number's own."""
    n = int(m.group(1))
    suffix = next(g for g in m.groups()[1:] if g)
    own = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return m.group(1) if suffix == own else m.group(0)


def clean_latex(s: str) -> str:
    """Drop LaTeX that never changes a value: math delimiters, spacing, sizing, ``\\dfrac``.

    >>> clean_latex(r"$\\dfrac{1}{2}$.")
    '\\\\frac{1}{2}'
    >>> clean_latex(r"\\left( 1,\\! 3 \\right]")
    '( 1, 3 ]'
    >>> clean_latex(r"\\begin{pmatrix}1\\\\ 2\\end{pmatrix}")  # a row break followed by a space
    '\\\\begin{pmatrix}1\\\\\\\\ 2\\\\end{pmatrix}'
    """
    s = s.strip().replace("\\\\", "\x00")  # a row break is never spacing: keep it out of reach
    s = re.sub(r",\\!\s*(?=\d{3}(?!\d))", ",", s)  # 11,\! 111,\! 100: thousands, however spaced
    for old, new in _LATEX_NOISE:
        s = s.replace(old, new)
    s = _SIZING.sub("", s)
    s = _TEXT_FUNCTION.sub(r"\\\1 ", s)
    s = _UNBRACED_FRAC.sub(r"\\frac\1{\2}", s)
    s = _ORDINAL.sub(_ordinal, s)
    if any(c in _CIRCLED for c in s):
        s = re.sub("[" + "".join(_CIRCLED) + "]+", lambda m: ", ".join(_CIRCLED[c] for c in m.group(0)), s)
    s = s.replace("\x00", "\\\\")
    s = s.strip().rstrip(".").strip()
    while s[:1] == "$" and s[-1:] == "$" and len(s) >= 2:
        s = s[1:-1].strip()
    if s.startswith("\\(") and s.endswith("\\)") or s.startswith("\\[") and s.endswith("\\]"):
        s = s[2:-2].strip()
    s = s.rstrip(".").rstrip()
    return re.sub(r"\s+", " ", s)


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:(?:,|\\,| )\d{3})+(?:\.\d+)?$")


def merge_thousands(s: str) -> str:
    """Remove thousands separators from a number written with them; anything else unchanged.

    >>> merge_thousands("12,345,678")
    '12345678'
    >>> merge_thousands("1 000.5")
    '1000.5'
    >>> merge_thousands("1, 2")  # a list of two answers, not a number
    '1, 2'
    """
    t = s.strip()
    if _THOUSANDS.match(t):
        return t.replace("\\,", "").replace(",", "").replace(" ", "")
    return s


_OPEN = "([{"
_CLOSE = ")]}"


def split_top_level(s: str, separators: tuple[str, ...] = (",", ";")) -> list[str]:
    """Split `s` at separators that are not inside brackets or braces.

    >>> split_top_level(r"\\frac{1}{2}, (3, 4); 5")
    ['\\\\frac{1}{2}', '(3, 4)', '5']
    """
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0:
            for sep in separators:
                if s.startswith(sep, i):
                    parts.append(s[start:i].strip())
                    start = i + len(sep)
                    i = start - 1
                    break
        i += 1
    parts.append(s[start:].strip())
    return parts


def brace_depth(s: str) -> int:
    """Deepest nesting of brackets and braces in `s` (a cheap guard against hostile input).

    >>> brace_depth("{{a}(b)}")
    2
    """
    depth = best = 0
    for c in s:
        if c in _OPEN:
            depth += 1
            best = max(best, depth)
        elif c in _CLOSE:
            depth -= 1
    return best


# -- multiple choice ------------------------------------------------------------------------

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mathtt)\{([^{}]*)\}")
_BARE_CHOICE = re.compile(r"^(?:option\s+|choice\s+)?\(?([A-J])\)?[.:]?$", re.IGNORECASE)
_CHOICE_WITH_TEXT = re.compile(r"^(?:\(([A-J])\)|([A-J])[.):])\s*\S", re.IGNORECASE)


def _unwrap(s: str) -> str:
    s = clean_latex(s)
    for _ in range(3):  # \textbf{(\text{B})} and the like
        s = _WRAPPERS.sub(r"\1", s)
    return s.replace("**", "").strip()


def parse_choice(s: str, allow_text: bool = False) -> str | None:
    """The option letter an answer names — ``B``, ``(B)``, ``\\text{(B)}``, ``\\textbf{B}`` — or None.

    With `allow_text`, an answer that names a letter and then repeats the option's text
    (``(B) 12``) also counts as that letter.

    >>> parse_choice(r"\\textbf{(C)}")
    'C'
    >>> parse_choice("(b)")
    'B'
    >>> parse_choice(r"(B) 12", allow_text=True)
    'B'
    >>> parse_choice("12") is None
    True
    >>> parse_choice("AB") is None
    True
    """
    s = _unwrap(s)
    m = _BARE_CHOICE.match(s)
    if m:
        return m.group(1).upper()
    if allow_text:
        m = _CHOICE_WITH_TEXT.match(s)
        if m:
            return (m.group(1) or m.group(2)).upper()
    return None


_OPTION_MARK = re.compile(r"(?:\\textbf\{)?\((?P<p>[A-J])\)\}?|(?:^|\n)\s*(?P<l>[A-J])[.):]\s")


def parse_choices(problem: str) -> dict[str, str]:
    """The options of a multiple-choice problem, letter -> option text; empty when none are found.

    Recognises ``(A) 12``, ``A. 12``, ``A) 12`` at line starts and the AMC style
    ``$\\textbf{(A)}\\ 12 \\qquad \\textbf{(B)}\\ 13$`` on one line.

    >>> parse_choices("Pick one.\\n(A) 12\\n(B) $\\\\frac{1}{2}$\\n(C) 3")
    {'A': '12', 'B': '\\\\frac{1}{2}', 'C': '3'}
    >>> parse_choices(r"$\\textbf{(A)}\\ 2 \\qquad \\textbf{(B)}\\ 4$")
    {'A': '2', 'B': '4'}
    >>> parse_choices("no options here")
    {}
    """
    marks = list(_OPTION_MARK.finditer(problem[-20000:]))
    text = problem[-20000:]
    out: dict[str, str] = {}
    for k, m in enumerate(marks):
        letter = m.group("p") or m.group("l")
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        body = text[m.end() : end].split("\n\n")[0]
        body = clean_latex(body.replace("\\qquad", " ").replace("\\quad", " "))
        body = body.strip().strip("$").strip()
        if body and letter not in out:
            out[letter] = body
    letters = sorted(out)
    # options are a run A, B, C, ...; anything else is not a list of choices
    if len(letters) < 2 or letters != [chr(ord("A") + i) for i in range(len(letters))]:
        return {}
    return out
