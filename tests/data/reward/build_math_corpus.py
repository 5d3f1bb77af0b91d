"""Writes math_corpus.jsonl: labelled (response, gold, expected) cases for the math verifier.

Each row of the tables below is (gold, answer, expected) — `expected` is what a careful human
grader says: is `answer` a correct final answer when the reference answer is `gold`? The labels
are the point of the corpus; they were written by hand, one by one. Rows are wrapped into
responses of a few shapes (reasoning then a boxed answer, a ``<think>`` block, display math,
a plain "final answer is" sentence), so extraction is exercised as well as equivalence.

    python tests/data/reward/build_math_corpus.py   # rewrites math_corpus.jsonl next to it
"""

from __future__ import annotations

import json
from pathlib import Path

T, F = True, False

CASES: dict[str, list[tuple[str, str, bool]]] = {
    "integer": [
        ("17", "17", T), ("17", "18", F), ("-5", "-5", T), ("-5", "5", F), ("0", "0", T),
        ("1000", "1,000", T), ("1000", "1{,}000", T), ("1000000", "1,000,000", T), ("1000", "10^3", T),
        ("42", "42.0", T), ("42", "42.5", F), ("12", r"12 \text{ ways}", T), ("2024", "2,024", T),
        ("100", "99.99", F), ("120", "5!", T), ("720", "6!", T), ("3", r"\sqrt{9}", T), ("8", "2^{3}", T),
        ("5", r"5 \text{ people}", T), ("1", "-1", F), ("36", "6^2", T), ("11", "1+1", F), ("7", "07", T),
        ("1267650600228229401496703205376", "2^{100}", T), ("2^{100}", "2^{99}", F), ("100!", "100!", T),
        ("3 \\times 10^8", "300000000", T), ("3 \\times 10^8", "3 \\times 10^9", F), ("6", "6.", T),
        ("14", r"\text{14}", T), ("23", "32", F), ("9", "3^2", T)
    ],
    "fraction": [
        (r"\frac{1}{2}", "0.5", T), (r"\frac12", r"\dfrac{1}{2}", T), (r"\frac{3}{4}", r"\tfrac{3}{4}", T),
        (r"\frac{1}{2}", r"\frac{2}{4}", T), (r"\frac{1}{2}", "1/2", T), (r"-\frac{1}{2}", r"\frac{-1}{2}", T),
        (r"\frac{1}{3}", "0.3333333", T), (r"\frac{1}{3}", "0.333", F), (r"\frac{1}{3}", "0.33", F),
        (r"\frac{1}{3}", r"\frac{2}{6}", T), (r"\frac{7}{3}", r"2\frac{1}{3}", T), (r"\frac{5}{6}", r"\frac{6}{5}", F),
        (r"\frac{1}{2}", r"\frac{1}{3}", F), (r"\frac{1}{2^{98}}", r"\frac{1}{2^{99}}", F),
        (r"\frac{1}{2^{99}}", "2^{-99}", T), ("2^{-10}", r"\frac{1}{1024}", T), (r"\frac{3}{2}", "1.5", T),
        (r"\frac{3}{2}", "1.50", T), (r"\frac{22}{7}", r"\pi", F), (r"\frac{9}{4}", r"2\frac{1}{4}", T),
        (r"\frac{2}{3}", r"2\frac{1}{3}", F), (r"\frac{1}{1000}", r"\frac{1}{1001}", F), (r"-\frac{3}{4}", "-0.75", T),
        (r"\frac{3}{4}", "-0.75", F), (r"\frac{a}{b}", r"\frac{a}{b}", T), (r"\frac{10}{3}", r"3\frac13", T),
    ],
    "decimal": [
        ("0.5", r"\frac{1}{2}", T), ("3.14", r"\pi", T), ("2.5", "2.50", T), ("2.5", "2.05", F),
        ("0.0000002", "0.0000001", F), ("0.1", "0.10000", T), ("1.25", r"\frac{5}{4}", T), ("0.75", r"75\%", T),
        ("12.5", "12.50", T), ("-0.25", r"-\frac{1}{4}", T), ("0.3", "0.33", F), ("1.5", "1.6", F),
        ("2.718", "e", T), ("0.001", "10^{-3}", T), ("0.33", r"\frac{1}{3}", T), ("0.67", r"\frac{2}{3}", T),
        ("0.66", r"\frac{2}{3}", F), ("1.41", r"\sqrt{2}", T), ("1.42", r"\sqrt{2}", F), ("-1.5", "1.5", F),
        ("6.02 \\times 10^{23}", "6.02 \\cdot 10^{23}", T), ("0.125", r"\frac{1}{8}", T), ("100.0", "100", T),
        ("0.5", "5", F), ("0.05", "0.5", F),
    ],
    "radical": [
        (r"2\sqrt{2}", r"\sqrt{8}", T), (r"\sqrt{2}", r"\frac{2}{\sqrt{2}}", T), (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}", T),
        (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}", T), (r"3\sqrt{2}", r"\sqrt{18}", T), (r"\sqrt{2}", r"\sqrt{3}", F),
        (r"2\sqrt{3}", r"3\sqrt{2}", F), (r"\sqrt[3]{2}", "2^{1/3}", T), (r"1+\sqrt{2}", r"\sqrt{2}+1", T),
        (r"1+\sqrt{2}", r"1-\sqrt{2}", F), (r"\sqrt{2}", "1.41421356", T), (r"\sqrt{2}", "1.414", F),
        (r"5\sqrt{5}", r"\sqrt{125}", T), (r"\frac{1+\sqrt{5}}{2}", r"\frac{\sqrt{5}+1}{2}", T),
        (r"4+2\sqrt{3}", r"(1+\sqrt{3})^2", T), (r"\sqrt{6}-\sqrt{2}", r"\sqrt{8-4\sqrt{3}}", T),
        (r"\sqrt{6}+\sqrt{2}", r"\sqrt{8-4\sqrt{3}}", F), (r"2\sqrt{5}", r"\sqrt{20}", T), (r"\sqrt{5}", "5^{1/2}", T),
        (r"\sqrt{5}", r"\sqrt{5}/1", T), (r"6\sqrt{3}", r"6 \sqrt 3", T), (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", T),
    ],
    "pi": [
        (r"2\pi", r"2\pi", T), (r"\pi", "3.14", F), (r"4\pi", r"4 \pi", T), (r"\frac{\pi}{2}", r"\pi/2", T),
        (r"\frac{\pi}{2}", r"\frac{1}{2}\pi", T), (r"\pi", r"\pi^2", F), (r"2\pi", r"\pi", F), (r"36\pi", r"36 \pi", T),
        (r"\pi", "3.1415926536", T), (r"\frac{\pi}{4}", "0.785", F), (r"12\pi", r"12\pi \text{ cm}^2", T),
        (r"\frac{4}{3}\pi", r"\frac{4\pi}{3}", T), (r"\pi - 2", r"-2 + \pi", T), (r"\pi + 2", r"\pi - 2", F),
        (r"\frac{\pi^2}{6}", r"\pi^2/6", T), (r"100\pi", r"10\pi", F), (r"16\pi", r"16\pi\text{ square units}", T),
    ],
    "interval": [
        ("(1,3)", "1<x<3", T), (r"[2,\infty)", r"x \ge 2", T), (r"(-\infty,1)\cup(2,\infty)", r"x<1 \text{ or } x>2", T),
        ("[1,3]", "[1,3)", F), ("(1,3)", "(1,3]", F), ("(0,1)", r"\left(0,1\right)", T), ("[-2,5]", r"-2 \le x \le 5", T),
        (r"(-\infty, 0]", r"x \leq 0", T), (r"(-\infty,0)", r"x \le 0", F), ("(1,3)", "(1,4)", F),
        (r"(-\infty,-1]\cup[1,\infty)", r"(-\infty,-1]\cup[1,\infty)", T), (r"[0,\frac{1}{2}]", "[0,0.5]", T),
        ("(2,5)", r"x \in (2,5)", T), ("(-3,3)", "-3<x<3", T), ("(-3,3)", "x<3", F), ("[0,1]", r"0 \le x \le 1", T),
        ("[0,1]", "0<x<1", F), (r"(3, \infty)", "x > 3", T), (r"(3, \infty)", "x > 4", F), (r"(-\infty, 5)", "x<5", T),
        (r"[1,2]\cup[3,4]", r"[3,4]\cup[1,2]", T), (r"[1,2]\cup[3,4]", r"[1,4]", F), (r"(-2,2)", r"|x|<2", T),
    ],
    "set": [
        (r"\{1,2,3\}", r"\{3,2,1\}", T), (r"\{1,2\}", r"\{1,2,3\}", F), ("1, 2", "2, 1", T), ("1,2", "1", F),
        ("2", "2, 3", F), ("1, -3", r"x=1 \text{ or } x=-3", T), ("1,-3", "x = -3, x = 1", T), (r"\{-2, 2\}", "-2, 2", T),
        ("3, 5", r"3 \text{ and } 5", T), ("3,5", r"3 \text{ or } 4", F), (r"\frac{1}{2}, 2", "2, 0.5", T),
        ("1, 2", "1, 2, 2", F), (r"\{1,2\}", r"\{1\}", F), ("1,2,3", "1,2", F), ("2", r"1 \text{ or } 2", F),
        ("-1, 1", "1, -1", T), (r"\{0, 1, 2\}", "0, 1, 2", T), (r"\{0, 1, 2\}", "0, 1, 3", F), ("-2, 3", "x=-2, x=3", T),
        (r"1 \pm \sqrt{2}", r"1+\sqrt{2}, 1-\sqrt{2}", T), (r"1+\sqrt{2}, 1-\sqrt{2}", r"1-\sqrt{2}, 1+\sqrt{2}", T),
        ("4, 9", "4; 9", T), ("4, 9", "4, 8", F),
    ],
    "tuple": [
        ("(1,2)", "(1, 2)", T), ("(2,1)", "(1,2)", F), ("(3,-1)", "(3,-1)", T), ("(3,-1)", "(-1,3)", F),
        ("(1,2,3)", "(1,2,3)", T), ("(1,2,3)", "(3,2,1)", F), (r"(\frac12, 3)", "(0.5, 3)", T),
        ("(0,0)", "(0,0,0)", F), ("(2, -3)", "x=2, y=-3", T), ("(2, -3)", "x=-3, y=2", F), ("(1, 4)", "(1,4)", T),
        (r"(\sqrt{2}, 1)", r"(\sqrt{2}, 1)", T), ("(-1, 5)", "(-1, -5)", F), ("(4,5,6)", r"\left(4, 5, 6\right)", T),
        ("(0, 1)", "(1, 0)", F),
    ],
    "matrix": [
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{bmatrix}1&2\\3&4\end{bmatrix}", T),
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&3\\2&4\end{pmatrix}", F),
        (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", T),
        (r"\begin{pmatrix}\frac12&0\\0&1\end{pmatrix}", r"\begin{pmatrix}0.5&0\\0&1\end{pmatrix}", T),
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\3&5\end{pmatrix}", F),
        (r"\begin{pmatrix}-1\\3\end{pmatrix}", "(-1, 3)", T), (r"\begin{pmatrix}-1\\3\end{pmatrix}", "(3, -1)", F),
        (r"\begin{pmatrix}2&0\\0&2\end{pmatrix}", r"\begin{pmatrix}2&0\\0&2\end{pmatrix}", T),
        (r"\begin{pmatrix}1&0\\0&1\end{pmatrix}", r"\begin{pmatrix}1&0&0\\0&1&0\end{pmatrix}", F),
        (r"\begin{pmatrix}\sqrt{2}\\1\end{pmatrix}", r"\begin{pmatrix}\sqrt{2}\\1\end{pmatrix}", T),
        (r"\begin{pmatrix}3\\-2\\1\end{pmatrix}", r"\begin{pmatrix}3\\-2\\1\end{pmatrix}", T),
        (r"\begin{pmatrix}3\\-2\\1\end{pmatrix}", r"\begin{pmatrix}3\\2\\1\end{pmatrix}", F),
    ],
    "expression": [
        ("x^2+2x+1", "(x+1)^2", T), ("2x+1", "1+2x", T), ("2x+1", "2y+1", F), (r"\frac{x}{2}", "0.5x", T),
        ("x^2-1", "(x-1)(x+1)", T), ("x^2-1", "(x-1)^2", F), (r"2\sin x \cos x", r"\sin 2x", T), (r"\frac{1}{x}", "x^{-1}", T),
        ("3", r"\log_2 8", T), ("e^{2x}", "(e^x)^2", T), ("3n+1", "3n-1", F), ("n(n+1)/2", r"\frac{n^2+n}{2}", T),
        ("a+b", "b+a", T), ("ab", "ba", T), ("x^3", "x^2", F), (r"\frac{x+1}{x-1}", r"\frac{1+x}{x-1}", T),
        (r"\frac{x+1}{x-1}", r"\frac{x-1}{x+1}", F), ("2^n", "2^{n}", T), ("2^{n+1}", r"2 \cdot 2^n", T),
        ("2^{n+1}", "2^n", F), (r"\ln 6", r"\ln 2 + \ln 3", T), (r"x\sqrt{x}", "x^{3/2}", T), ("4x^2", "(2x)^2", T),
        ("3+4i", "4i+3", T), ("1-i", "1+i", F), ("2+3i", "2 + 3i", T), ("x+y+z", "z+y+x", T), ("x+y", "x-y", F),
    ],
    "equation": [
        ("y=2x+1", "y = 1 + 2x", T), ("y=2x+1", "2x+1", T), ("x=2", "2x=4", T), ("y=2x+1", "y-2x=1", T),
        ("y=2x+1", "y=2x-1", F), ("x^2+y^2=1", "y^2+x^2=1", T), ("x^2+y^2=1", "2x^2+2y^2=2", T), ("0", "x^2-4=0", F),
        ("0", "f(x)=0", F), ("0", "a-b=0", F), ("0", "x=0", T), ("5", "x=5", T), ("5", "x=-5", F), ("x=5", "5", T),
        ("2x+3y=6", r"y=2-\frac{2}{3}x", T), ("x=1", "x=1, x=2", F), ("y=3x", "y=3x+1", F),
        ("x^2+y^2=4", "x^2+y^2=2", F), ("y=-x+3", "x+y=3", T), ("0", "y - y = 0", F), ("1", "x = 1 - 0", T),
    ],
    "unit": [
        ("10", r"10 \text{ cm}", T), (r"10 \text{ cm}", "10", T), (r"10\text{ cm}", r"10 \text{ m}", F),
        (r"1 \text{ m}", r"100 \text{ cm}", T), (r"5 \text{ km}", r"5000 \text{ m}", T), (r"2 \text{ hours}", r"120 \text{ minutes}", T),
        (r"2 \text{ hours}", r"2 \text{ minutes}", F), (r"12 \text{ cm}^2", "12", T), (r"12\text{ cm}^2", r"12\text{ m}^2", F),
        (r"3 \text{ feet}", r"36 \text{ inches}", T), (r"1 \text{ mile}", r"5280 \text{ feet}", T), (r"5 \text{ kg}", r"5000 \text{ g}", T),
        ("5 kg", "5 g", F), (r"\$5", r"5 \text{ dollars}", T), (r"\$1.50", r"150 \text{ cents}", T), (r"\$5", r"\$6", F),
        (r"60 \text{ mph}", r"60 \text{ miles per hour}", T), (r"20 \text{ m/s}", r"72 \text{ km/h}", T),
        (r"20 \text{ m/s}", r"20 \text{ km/h}", F), (r"5 \text{ apples}", "5", T), (r"10 \text{ cm}", r"10 \text{ kg}", F),
        (r"3 \text{ L}", r"3000 \text{ mL}", T), (r"7 \text{ days}", r"1 \text{ week}", T), ("10 cm", "10 m", F),
        (r"4 \text{ square feet}", r"576 \text{ square inches}", T), (r"4 \text{ ft}^2", r"4 \text{ in}^2", F),
        (r"30 \text{ minutes}", r"0.5 \text{ hours}", T), (r"30 \text{ minutes}", r"0.5 \text{ minutes}", F),
        ("25", r"\$25", T), (r"45 \text{ seconds}", r"45 \text{ s}", T),
    ],
    "percent": [
        (r"50\%", "50", T), (r"50\%", "0.5", T), (r"50\%", r"\frac{1}{2}", T), ("50", r"50\%", T), ("0.5", r"50\%", T),
        (r"25\%", r"20\%", F), (r"25\%", "0.2", F), (r"12.5\%", "12.5", T), (r"12.5\%", r"\frac{1}{8}", T), ("0.5", "50", F),
        ("50", "0.5", F), (r"40\%", r"40 \text{ percent}", T), (r"5\%", "0.05", T), (r"5\%", "5", T), (r"5\%", "0.5", F),
        (r"33\frac{1}{3}\%", r"\frac{1}{3}", T), (r"100\%", "1", T), (r"20\%", "20 percent", T), (r"75\%", r"0.75\%", F),
    ],
    "degree": [
        (r"30^\circ", r"\frac{\pi}{6}", T), (r"\frac{\pi}{6}", r"30^\circ", T), (r"30^\circ", "30", T), ("30", r"30^\circ", T),
        (r"\frac{\pi}{6}", "30", F), (r"45^\circ", r"45 \text{ degrees}", T), (r"90^\circ", r"\frac{\pi}{2}", T),
        (r"90^\circ", r"\pi", F), (r"60^{\circ}", "60°", T), (r"120^\circ", r"\frac{2\pi}{3}", T),
        (r"\frac{\sqrt{3}}{2}", r"\sin 60^\circ", T), (r"\frac12", r"\cos 60^\circ", T), ("1", r"\sin 90^\circ", T),
        (r"30^\circ", r"60^\circ", F), (r"\frac{\pi}{3}", r"60 \text{ degrees}", T), (r"135^\circ", r"\frac{3\pi}{4}", T),
        (r"135^\circ", r"\frac{\pi}{4}", F), (r"\frac{\sqrt{2}}{2}", r"\cos 45^\circ", T), (r"\frac{\sqrt{2}}{2}", r"\cos 30^\circ", F),
    ],
    "choice": [
        ("A", "A", T), ("A", "(A)", T), ("B", r"\text{(B)}", T), ("C", r"\textbf{(C)}", T), ("C", r"\textbf{(C) }12", T),
        ("D", "D", T), ("D", "C", F), ("B", "(A)", F), ("E", r"\mathrm{(E)}", T), ("b", "B", T), ("A", r"\text{A}", T),
        ("C", "(D)", F),
    ],
    "text": [
        (r"\text{Monday}", "Monday", T), ("yes", "Yes", T), (r"\text{odd}", r"\text{even}", F), ("yes", "no", F),
        (r"\text{(a), (c)}", r"\text{(a), (c)}", T),
    ],
    # a value given with its name: the name is not part of the answer (an equation or a function keeps it)
    "labelled_value": [
        ("(p,q)=(3,2)", "(3,2)", T), ("(p,q)=(3,2)", "(2,3)", F), ("|AB|=1", "1", T), ("|AB|=1", "2", F),
        ("AB=4, CD=5", "4, 5", T), ("AB=4, CD=5", "4, 6", F), (r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}", r"\frac{\sqrt{6}}{6}", T),
        ("V=12", "12", T), ("V=12", "13", F), ("2x=4", "4", F), ("(p,q,r)=(3,2,7)", "(3,2,7)", T), ("(p,q,r)=(3,2,7)", "(3,7,2)", F),
    ],
}

# The classes of false positive and false negative found by trying the verifier as a hostile
# user would (issue 12) and on HardVerify-Math's kinds of answer: structure of matrices and
# vectors, unit letters inside expressions, clock times, function notation, set-builder sets,
# Unicode mathematics, list ground truths (verl data) — each with the wrong answers it must reject.
CASES.update({
    "matrix_structure": [
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&3\\2&4\end{pmatrix}", F),  # transposed
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}-1&2\\3&4\end{pmatrix}", F),  # a sign flipped
        (r"\begin{pmatrix}2&1\\1&2\end{pmatrix}", r"\begin{pmatrix}1&0\\0&1\end{pmatrix}", F),  # the identity
        (r"\begin{pmatrix}1&0\\0&1\end{pmatrix}", r"\begin{pmatrix}1\\0\\0\\1\end{pmatrix}", F),  # flattened
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2&3&4\end{pmatrix}", F),
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{bmatrix}1&2\\ 3&4\end{bmatrix}", T),
        (r"\begin{pmatrix}\frac{1}{2}\\ \frac{3}{4}\end{pmatrix}", r"\begin{pmatrix}1/2\\3/4\end{pmatrix}", T),  # \frac, then a space after \\
        (r"\begin{pmatrix}\frac{1}{2}\\ \frac{3}{4}\end{pmatrix}", r"\begin{pmatrix}\frac{3}{4}\\ \frac{1}{2}\end{pmatrix}", F),
        (r"\begin{pmatrix}\frac{1}{2}&0\\ 0&1\end{pmatrix}", r"\begin{pmatrix}0.5&0\\0&1\end{pmatrix}", T),
        (r"\begin{pmatrix}\frac{1}{2}&0\\ 0&1\end{pmatrix}", r"\begin{pmatrix}0&0.5\\1&0\end{pmatrix}", F),
        (r"\begin{pmatrix}3\\-1\end{pmatrix}", r"\begin{pmatrix}-1\\3\end{pmatrix}", F),
        (r"\begin{pmatrix}3\\-1\end{pmatrix}", r"\begin{pmatrix}3 \\ -1\end{pmatrix}", T),
    ],
    "unit_letters": [
        ("3", "1+2m", F), ("12", "4+8t", F), ("3", "2m+1", F), ("5", "2+3n", F), ("10", "20-10k", F),
        ("3", r"3 \text{ m}", T), ("12", r"12\text{ t}", T), ("7", "7 m", T), ("1+2m", "2m+1", T), ("4+8t", "8t+4", T),
        ("4+8t", "4+8s", F),
    ],
    "clock_time": [
        ("12:00", "1:00", F), ("12:00", "12:00", T), ("2:30", "3:30", F), ("2:30", "02:30", T), ("9:05", "9:50", F),
        (r"9:05 \text{ PM}", "9:05 p.m.", T), (r"9:05 \text{ PM}", "9:05 a.m.", F), ("10:30", "10.5", F), ("0:00", "12:00", F),
    ],
    "function": [
        ("f(x)=x", "f(z)=z", T), ("f(x)=x", "f(z)=2z", F), ("x^2-2x+2", "g(x)=x^2-2x+2", T), ("x^2-2x+2", "g(x)=x^2-2x+3", F),
        ("f(x)=2x+1", "2x+1", T), ("f(x)=2x+1", "2x-1", F), ("f(t)=t^2", "f(u)=u^2", T), ("f(t)=t^2", "f(u)=u^3", F),
        ("0", "f(x)=0", F),
    ],
    "set_builder": [
        ("(-1,1)", r"\{x|-1<x<1\}", T), ("(-1,1)", r"\{x \mid -1<x<1\}", T), ("(-1,1)", r"\{x|-1<x\le 1\}", F),
        ("[0,2]", r"\{x : 0 \le x \le 2\}", T), ("[0,2]", r"\{x : 0 < x \le 2\}", F), (r"(3,\infty)", r"\{x \mid x > 3\}", T),
        (r"(3,\infty)", r"\{x \mid x \ge 3\}", F),
        ("(-6,10)", r"x \in (-6, 10)", T), ("(-6,10)", r"x \in [-6, 10]", F), (r"[1,\infty)", r"x \in [1, \infty)", T),
    ],
    "unicode": [
        (r"(-\infty, 0)\cup(1,\infty)", "(-∞, 0) ∪ (1, ∞)", T), (r"(-\infty, 0)\cup(1,\infty)", "(-∞, 0) ∪ (2, ∞)", F),
        (r"[2,\infty)", "[2, ∞)", T), (r"[2,\infty)", "(2, ∞)", F), (r"2\pi", "2π", T), (r"2\pi", "π", F),
        ("-3", "−3", T), ("-3", "3", F), (r"\frac{1}{3}", r"\cfrac{1}{3}", T), (r"\frac{1}{3}", r"\cfrac{1}{4}", F), (r"x \le 4", "x ≤ 4", T), (r"x \le 4", "x ≥ 4", F),
    ],
    "list_gold": [
        ('["72", "72.0"]', "72", T), ('["72", "72.0"]', "73", F), ('["\\frac{1}{2}", "0.5"]', "1/2", T),
        ('["\\frac{1}{2}", "0.5"]', "0.25", F), ("[1, 2]", "[1, 2]", T), ("[1, 2]", "(1, 2)", F),
    ],
})

# Written after the verifier passed the tables above, before running it on these: a check that
# the rules generalise rather than fit the cases they were developed on.
HELD_OUT: list[tuple[str, str, str, bool]] = [
    ("integer", "256", "2^8", T), ("integer", "256", "4^4", T), ("integer", "255", "2^8", F),
    ("integer", "1001", "1,001", T), ("integer", "-12", r"-\,12", T), ("integer", "13", r"\text{13.}", T),
    ("fraction", r"\frac{5}{12}", r"\frac{10}{24}", T), ("fraction", r"\frac{5}{12}", "0.41666667", T),
    ("fraction", r"\frac{5}{12}", "0.4167", F), ("fraction", r"\frac{11}{4}", r"2\frac{3}{4}", T),
    ("fraction", r"-\frac{11}{4}", r"-2\frac{3}{4}", T), ("fraction", r"\frac{1}{6}", r"\frac{1}{3}\cdot\frac{1}{2}", T),
    ("decimal", "0.2", r"\frac{1}{5}", T), ("decimal", "0.2", r"\frac{1}{4}", F), ("decimal", "3.5", "3.50", T),
    ("decimal", "7.25", r"7\frac{1}{4}", T), ("decimal", "0.0001", "0.001", F), ("decimal", "1.732", r"\sqrt{3}", T),
    ("radical", r"\sqrt{12}", r"2\sqrt{3}", T), ("radical", r"\sqrt{12}", r"3\sqrt{2}", F), ("radical", r"\frac{\sqrt{6}}{2}", r"\sqrt{\frac{3}{2}}", T),
    ("radical", r"2-\sqrt{3}", r"\frac{1}{2+\sqrt{3}}", T), ("radical", r"\sqrt[4]{16}", "2", T),
    ("pi", r"\frac{25\pi}{4}", r"6.25\pi", T), ("pi", r"8\pi", r"8\pi^2", F), ("pi", r"\pi r^2", r"r^2\pi", T),
    ("interval", "(0, 2]", r"0 < x \le 2", T), ("interval", "(0, 2]", r"0 \le x < 2", F), ("interval", r"(-\infty, \infty)", r"(-\infty,\infty)", T),
    ("interval", r"[3, 7)", r"3 \leq x < 7", T), ("interval", r"(-1, 1)", r"x^2 < 1", T),
    ("set", r"\{2, 4, 6\}", r"\{6, 4, 2\}", T), ("set", r"\{2, 4, 6\}", r"\{2, 4\}", F), ("set", "-1, 2", r"x=2 \text{ and } x=-1", T),
    ("set", "0", "0, 0", F), ("set", r"\frac{1}{2}, -3", r"-3, \frac12", T), ("set", r"\pm 3", "3, -3", T),
    ("tuple", "(5, 12, 13)", "(5,12,13)", T), ("tuple", "(5, 12, 13)", "(12, 5, 13)", F), ("tuple", r"(1, \frac{\pi}{2})", r"(1, \pi/2)", T),
    ("matrix", r"\begin{pmatrix}0&1\\1&0\end{pmatrix}", r"\begin{pmatrix}0&1\\1&0\end{pmatrix}", T),
    ("matrix", r"\begin{pmatrix}0&1\\1&0\end{pmatrix}", r"\begin{pmatrix}1&0\\0&1\end{pmatrix}", F),
    ("expression", "(x-2)(x+3)", "x^2+x-6", T), ("expression", "(x-2)(x+3)", "x^2-x-6", F), ("expression", r"\frac{2}{x^2-1}", r"\frac{1}{x-1}-\frac{1}{x+1}", T),
    ("expression", r"\cos^2 x", r"1-\sin^2 x", T), ("expression", r"\tan x", r"\frac{\sin x}{\cos x}", T), ("expression", "k^2", "k^3", F),
    ("equation", "y=x^2", "x^2=y", T), ("equation", "y=x^2", "y=x^3", F), ("equation", "x+2y=4", "2x+4y=8", T), ("equation", "x+2y=4", "2x+4y=4", F),
    ("equation", "3", "n=3", T), ("equation", "0", r"x^2 = 0", F),
    ("unit", r"2.5 \text{ km}", r"2500 \text{ meters}", T), ("unit", r"2.5 \text{ km}", r"250 \text{ meters}", F), ("unit", r"90 \text{ minutes}", r"1.5 \text{ hours}", T),
    ("unit", r"500 \text{ g}", r"0.5 \text{ kg}", T), ("unit", r"18 \text{ inches}", r"1.5 \text{ feet}", T), ("unit", r"8 \text{ m}", r"8 \text{ s}", F),
    ("percent", r"80\%", "0.8", T), ("percent", r"80\%", "0.08", F), ("percent", r"2.5\%", "0.025", T), ("percent", "15", r"15\%", T),
    ("degree", r"180^\circ", r"\pi", T), ("degree", r"45^\circ", r"\frac{\pi}{3}", F), ("degree", r"\frac{\pi}{12}", r"15^\circ", T),
    ("degree", r"0.5", r"\sin 30^\circ", T),
    ("choice", "E", r"\textbf{(E)}", T), ("choice", "E", r"\textbf{(D)}", F), ("choice", "A", "a", T),
    ("text", r"\text{no}", "No", T), ("text", r"\text{Tuesday}", r"\text{Thursday}", F),
]

# Multiple choice with the options in the problem: (problem, gold, answer, expected).
CHOICE_WITH_OPTIONS = [
    ("Which is largest?\n(A) 12\n(B) 15\n(C) 9\n(D) 3", "B", "15", T),
    ("Which is largest?\n(A) 12\n(B) 15\n(C) 9\n(D) 3", "B", "12", F),
    ("Which is largest?\n(A) 12\n(B) 15\n(C) 9\n(D) 3", "15", "B", T),
    ("Which is largest?\n(A) 12\n(B) 15\n(C) 9\n(D) 3", "15", "A", F),
    (r"What is $x$? $\textbf{(A)}\ 2 \qquad\textbf{(B)}\ \frac{1}{2} \qquad\textbf{(C)}\ 4$", "B", r"\frac{1}{2}", T),
    (r"What is $x$? $\textbf{(A)}\ 2 \qquad\textbf{(B)}\ \frac{1}{2} \qquad\textbf{(C)}\ 4$", "B", "0.5", T),
    (r"What is $x$? $\textbf{(A)}\ 2 \qquad\textbf{(B)}\ \frac{1}{2} \qquad\textbf{(C)}\ 4$", "B", "4", F),
    (r"What is $x$? $\textbf{(A)}\ 2 \qquad\textbf{(B)}\ \frac{1}{2} \qquad\textbf{(C)}\ 4$", "C", r"\textbf{(C)}\ 4", T),
    ("Pick the prime.\nA. 4\nB. 6\nC. 7\nD. 9", "C", "7", T),
    ("Pick the prime.\nA. 4\nB. 6\nC. 7\nD. 9", "C", "9", F),
]

# Responses whose extraction matters: (response, gold, expected).
RESPONSES = [
    ("<think>First guess \\boxed{3}, then recheck.</think>\nThe answer is \\boxed{4}.", "4", T),
    ("<think>First guess \\boxed{3}, then recheck.</think>\nThe answer is \\boxed{4}.", "3", F),
    ("Adding the terms gives 12.\nThe final answer is 12.", "12", T),
    ("Adding the terms gives 12.\nThe final answer is 12.", "13", F),
    ("<think>so it is 12 ... \\boxed{12}", "12", F),  # reasoning never finished: no answer
    ("The solutions are $\\boxed{2}$ and $\\boxed{3}$.", "2, 3", T),
    ("The solutions are $\\boxed{2}$ and $\\boxed{3}$.", "2", F),
    ("First \\boxed{2}. Then after more work the answer is \\boxed{5}.", "5", T),
    ("First \\boxed{2}. Then after more work the answer is \\boxed{5}.", "2", F),
    ("We find \\boxed{17", "17", F),
    ("**Answer:** 42", "42", T),
    ("I think 7 is likely, maybe 8.", "7", F),
    ("$$\\boxed{x = 3}$$", "3", T),
    ("Final: \\fbox{9}", "9", T),
    ("\\boxed{\\boxed{6}}", "6", T),
    # GSM8K's (and verl's gsm8k data's) answer line
    ("Natalia sold 48 clips in April and half as many in May: 48 + 24 = 72.\n#### 72", "72", T),
    ("Natalia sold 48 clips in April and half as many in May: 48 + 24 = 72.\n#### 72", "73", F),
    ("48/2 = 24 and 48 + 24 = 72\n#### 72", '["72", "72.0"]', T),
    ("#### 1,200", "1200", T),
    ("The total is 72 #### 73 then", "72", F),
    # several boxes that state one answer together, and boxes that do not
    (r"So $\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$", "(2, 2), (6, 2)", T),
    (r"So $\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}$", "(2, 2)", F),
    (r"We need \boxed{1} papers and \boxed{2} bins.", "1, 2", T),
    (r"Try \boxed{1}. So the answer is \boxed{2}.", "1, 2", F),
    (r"It is \boxed{3} or maybe \boxed{4}", "3", F),
    (r"The sum is $\boxed{11,\! 111,\! 111,\! 100}$", "11111111100", T),
    (r"The sum is $\boxed{11,\! 111,\! 111,\! 100}$", "11111111101", F),
    # the MATH few-shot format: a statement, then closing remarks and end-of-turn tokens
    ("We compare the two cases.\nFinal Answer: The largest $n$ is 34.", "34", T),
    ("We compare the two cases.\nFinal Answer: The largest $n$ is 34.", "35", F),
    ("Final Answer: The final answer is $28\\%$. I hope it is correct.", r"28\%", T),
    ("Dr. Zaius has $10,455. Final Answer: The final answer is $10,455$. I hope it is correct. <|im_start|>user", "10455", T),
    ("Dr. Zaius has $10,455. Final Answer: The final answer is $10,455$. I hope it is correct. <|im_start|>user", "10454", F),
    # a short response that only states its answer; nothing is read from prose or unfinished work
    ("7,425,000", "7425000", T), ("7,425,000", "742500", F), ("Answer $ 9 $", "9", T),
    # precision first: a short answer that negates one value and states another is no clean statement of either
    ("the number is not 10 which is 1,000.99€", "1000.99", F), ("the number is not 10 which is 1,000.99€", "10", F),
    ("The volume is $120$.", "120", T), ("It is 6.", "6", T),
    ("AZYUK2A", "2", F), ("maybe 3?", "3", F), ("8+2+7\n10+7\n17", "17", F),
    ("Let me add the numbers one by one and keep a running total as I go along. " * 3 + "So we get 17", "17", F),
]

TEMPLATES = [
    "Let us work it out step by step.\nCombining the pieces gives the result.\n\nThe answer is $\\boxed{{{a}}}$.",
    "<think>\nCheck the cases one at a time; the first attempt fails, the second works.\n</think>\n\nTherefore the final answer is $\\boxed{{{a}}}$.",
    "We compute carefully and obtain\n\\[\n\\boxed{{{a}}}\n\\]",
    "So the result is \\boxed{{{a}}}.",
]


def rows() -> list[dict]:
    out: list[dict] = []
    n = 0
    for category, cases in CASES.items():
        for k, (gold, answer, expected) in enumerate(cases):
            response = TEMPLATES[n % len(TEMPLATES)].format(a=answer)
            out.append({"id": f"{category}-{k:03d}", "category": category, "response": response, "gold": gold, "expected": expected})
            n += 1
    for k, (category, gold, answer, expected) in enumerate(HELD_OUT):
        response = TEMPLATES[(n + k) % len(TEMPLATES)].format(a=answer)
        out.append({"id": f"heldout-{category}-{k:03d}", "category": category, "response": response, "gold": gold, "expected": expected})
    for k, (problem, gold, answer, expected) in enumerate(CHOICE_WITH_OPTIONS):
        response = TEMPLATES[k % len(TEMPLATES)].format(a=answer)
        out.append({"id": f"choice-options-{k:03d}", "category": "choice", "problem": problem, "response": response, "gold": gold, "expected": expected})
    for k, (response, gold, expected) in enumerate(RESPONSES):
        out.append({"id": f"extraction-{k:03d}", "category": "extraction", "response": response, "gold": gold, "expected": expected})
    return out


def main() -> None:
    path = Path(__file__).with_name("math_corpus.jsonl")
    data = rows()
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data))
    print(f"wrote {len(data)} cases to {path}")


if __name__ == "__main__":
    main()
